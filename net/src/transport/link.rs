//! The client side of one link, sans IO: the twin of [`super::peers::Peers`] for a role that
//! connects to one peer (an executor to its driver, a worker or an application to the master).
//!
//! A [`LinkCore`] runs the handshake on each connection, queues the bytes to send, says when
//! the connection is open (the hook to register, again after every reconnection), and keeps
//! the schedule: the attempt's deadline, the [`Backoff`] between attempts, the time the peer
//! was last heard (the [`Silence`] rule). No sockets or clock: every input carries `now_us`
//! (microseconds on the caller's one clock) and every output is polled:
//!
//! - inputs: [`LinkCore::handle_connected`], [`LinkCore::handle_frame`],
//!   [`LinkCore::handle_established`], [`LinkCore::handle_closed`],
//!   [`LinkCore::handle_timeout`];
//! - outputs: [`LinkCore::poll_transmit`] (bytes for the peer), [`LinkCore::poll_event`]
//!   (connect now, or drop the connection), [`LinkCore::poll_timeout`] (the one timer).
//!
//! The IO half ([`super::client::Link`], or an executor's endpoint) connects, reads, writes
//! and arms the timer.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::BytesMut;

use crate::conn::TABLE_FULL;
use crate::handshake::{Handshake, Secret};
use crate::seal::Seal;
use crate::wire::{Frame, Role};

/// The first wait after a failure; it doubles up to the link's maximum.
pub const BACKOFF_INITIAL: Duration = Duration::from_millis(50);

/// The waits between connection attempts: doubling from an initial wait up to a maximum, back
/// to the initial one when the link is established. Sans-IO: it only counts.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
    failures: u32,
}

impl Backoff {
    /// Waits from `initial`, doubling, at most `max`.
    pub fn new(initial: Duration, max: Duration) -> Backoff {
        Backoff {
            initial,
            max: max.max(initial),
            next: initial,
            failures: 0,
        }
    }

    /// Counts a failed attempt: its number since the last reset.
    pub fn failed(&mut self) -> u32 {
        self.failures = self.failures.saturating_add(1);
        self.failures
    }

    /// The wait before the next attempt (the next one waits twice as long, up to the maximum).
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(self.max);
        delay
    }

    /// The wait [`Backoff::next_delay`] would give, without taking it.
    pub fn peek(&self) -> Duration {
        self.next
    }

    /// Starts over: the link is established.
    pub fn reset(&mut self) {
        self.next = self.initial;
        self.failures = 0;
    }
}

/// "No word from the peer for `intervals` heartbeat intervals: drop the link and reconnect."
#[derive(Debug, Clone, Copy)]
pub struct Silence {
    /// Heartbeat intervals of silence tolerated.
    pub intervals: u32,
}

impl Silence {
    /// The silence tolerated at this heartbeat interval.
    pub fn limit(&self, interval: Duration) -> Duration {
        interval.saturating_mul(self.intervals)
    }

    /// Whether `silent_for` is over the limit at this heartbeat interval.
    pub fn exceeded(&self, interval: Duration, silent_for: Duration) -> bool {
        silent_for > self.limit(interval)
    }
}

/// Why a connection ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    /// What happened.
    pub why: String,
    /// The handshake failed for a reason other than a full table (a wrong secret, another
    /// version): trying again will not help.
    pub refused: bool,
}

/// How a [`LinkCore`] behaves.
#[derive(Debug, Clone)]
pub struct LinkRules {
    /// Our role in the handshake.
    pub role: Role,
    /// The roles the peer may have.
    pub peer_roles: &'static [Role],
    /// The shared secret, if any.
    pub secret: Option<Secret>,
    /// Who we are in the logs ("worker w1").
    pub label: String,
    /// Who the peer is in the logs ("the master").
    pub peer_name: &'static str,
    /// Where the peer is, for the logs.
    pub peer_addr: SocketAddr,
    /// Time one attempt has to connect, finish the handshake and be established; `None` when
    /// the IO side bounds it.
    pub connect_timeout_us: Option<u64>,
    /// The waits between attempts; `None`: one connection, no reconnection.
    pub backoff: Option<Backoff>,
}

/// What a frame from the peer was, from [`LinkCore::handle_frame`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Received {
    /// A step of the handshake, handled here.
    Handshake,
    /// The last step of the handshake: the peer (in this role) is authenticated, register now
    /// (append to [`LinkCore::outbound`]).
    Opened(Role),
    /// A frame after the handshake, for the role.
    Message,
}

/// What the IO side must do, from [`LinkCore::poll_event`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkEvent {
    /// Start a connection attempt (then [`LinkCore::handle_connected`]).
    Connect,
    /// Drop the current connection for this reason (its deadline passed); the next attempt is
    /// scheduled already.
    Drop(Ended),
}

enum State {
    /// No connection.
    Down,
    /// Connected, the handshake running.
    Handshake(Box<Handshake>),
    /// The handshake done; `established` once the peer accepted us.
    Open { established: bool },
}

/// One link's protocol state (see the module docs).
pub struct LinkCore {
    rules: LinkRules,
    state: State,
    /// Bytes not yet handed to [`LinkCore::poll_transmit`].
    transmit: BytesMut,
    /// The connection's seal, once its handshake has made one (see [`crate::seal`]).
    seal: Option<Box<Seal>>,
    /// Bytes at the head of `transmit` sent as they are: the handshake's last frames.
    plain_len: usize,
    deadline_us: Option<u64>,
    reconnect_us: Option<u64>,
    last_heard_us: u64,
    stopped: bool,
    event: Option<LinkEvent>,
}

impl std::fmt::Debug for LinkCore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkCore")
            .field("peer", &self.rules.peer_name)
            .field("open", &self.is_open())
            .field("established", &self.is_established())
            .finish_non_exhaustive()
    }
}

impl LinkCore {
    /// A link not connected yet: its first event at `now_us` is [`LinkEvent::Connect`].
    pub fn new(rules: LinkRules) -> LinkCore {
        LinkCore {
            rules,
            state: State::Down,
            transmit: BytesMut::new(),
            seal: None,
            plain_len: 0,
            deadline_us: None,
            reconnect_us: None,
            last_heard_us: 0,
            stopped: false,
            event: Some(LinkEvent::Connect),
        }
    }

    /// Whether the handshake is done on the current connection.
    pub fn is_open(&self) -> bool {
        matches!(self.state, State::Open { .. })
    }

    /// Whether the peer accepted us on the current connection.
    pub fn is_established(&self) -> bool {
        matches!(self.state, State::Open { established: true })
    }

    /// The buffer to append frames to, while the handshake is done.
    pub fn outbound(&mut self) -> Option<&mut BytesMut> {
        self.is_open().then_some(&mut self.transmit)
    }

    /// How long the peer has said nothing on this connection, in microseconds.
    pub fn silent_for_us(&self, now_us: u64) -> u64 {
        now_us.saturating_sub(self.last_heard_us)
    }

    /// Whether the peer has been silent past `rule` at heartbeat interval `interval`.
    pub fn is_silent(&self, rule: Silence, interval: Duration, now_us: u64) -> bool {
        rule.exceeded(interval, Duration::from_micros(self.silent_for_us(now_us)))
    }

    /// No attempt after the current connection ends (the role is over).
    pub fn stop_reconnecting(&mut self) {
        self.stopped = true;
        self.reconnect_us = None;
        if self.event == Some(LinkEvent::Connect) {
            self.event = None;
        }
    }

    /// A connection to the peer exists (or is being made): the handshake starts with `nonce`,
    /// our `Hello` is the first thing to transmit, and the attempt's deadline runs.
    pub fn handle_connected(&mut self, nonce: [u8; 32], now_us: u64) {
        self.transmit.clear();
        self.seal = None;
        let rules = &self.rules;
        let handshake = Handshake::connect(
            rules.role,
            rules.secret.clone(),
            nonce,
            rules.peer_roles,
            &mut self.transmit,
        );
        self.state = State::Handshake(Box::new(handshake));
        self.last_heard_us = now_us;
        self.reconnect_us = None;
        self.deadline_us = rules
            .connect_timeout_us
            .map(|timeout_us| now_us.saturating_add(timeout_us));
    }

    /// Feeds a frame from the peer. An `Err` ends the connection (a refusal for the peer may
    /// be queued: flush it, then [`LinkCore::handle_closed`]).
    pub fn handle_frame(&mut self, frame: &Frame, now_us: u64) -> Result<Received, Ended> {
        self.last_heard_us = now_us;
        let State::Handshake(handshake) = &mut self.state else {
            return Ok(Received::Message);
        };
        match handshake.on_frame(frame.kind(), frame.body(), &mut self.transmit) {
            Ok(None) => Ok(Received::Handshake),
            Ok(Some(role)) => {
                self.seal = handshake.take_seal().map(Box::new);
                self.plain_len = self.transmit.len();
                self.state = State::Open { established: false };
                Ok(Received::Opened(role))
            }
            Err(error) => {
                let why = error.to_string();
                Err(Ended {
                    refused: !why.contains(TABLE_FULL),
                    why: format!("handshake with {} failed: {why}", self.rules.peer_name),
                })
            }
        }
    }

    /// The frame to hand to [`LinkCore::handle_frame`]: opened if the connection is sealed
    /// (see [`crate::seal`]), else as it came. An `Err` (a bad seal: injected, changed,
    /// replayed, or a frame not sealed) ends the connection.
    pub fn unseal(&mut self, frame: Frame) -> Result<Frame, Ended> {
        let Some(seal) = self.seal.as_mut() else {
            return Ok(frame);
        };
        seal.open(&frame).map_err(|error| Ended {
            refused: false,
            why: format!(
                "{} broke the connection's seal: {error}",
                self.rules.peer_name
            ),
        })
    }

    /// The peer accepted us (a registration answered): the backoff starts over, the deadline
    /// is off, and losing the link from now on is logged as a loss.
    pub fn handle_established(&mut self) {
        if let State::Open { established } = &mut self.state {
            *established = true;
        }
        self.deadline_us = None;
        if let Some(backoff) = &mut self.rules.backoff {
            backoff.reset();
        }
    }

    /// The connection ended for `why`: the next attempt is scheduled (logged at info while the
    /// link was not established, as a loss at warn once it was).
    pub fn handle_closed(&mut self, why: &str, now_us: u64) {
        let was = std::mem::replace(&mut self.state, State::Down);
        self.transmit.clear();
        self.seal = None;
        self.deadline_us = None;
        if self.event == Some(LinkEvent::Connect) {
            self.event = None;
        }
        let (label, peer, addr) = (
            &self.rules.label,
            self.rules.peer_name,
            self.rules.peer_addr,
        );
        let Some(backoff) = self.rules.backoff.as_mut().filter(|_| !self.stopped) else {
            return;
        };
        if matches!(was, State::Open { established: true }) {
            tracing::warn!("{label}: lost {peer} ({why}); reconnecting");
        } else {
            let attempt = backoff.failed();
            tracing::info!(
                "{label}: cannot reach {peer} at {addr} (attempt {attempt}): {why}; retrying in {} ms",
                backoff.peek().as_millis()
            );
        }
        let delay_us = u64::try_from(backoff.next_delay().as_micros()).unwrap_or(u64::MAX);
        self.reconnect_us = Some(now_us.saturating_add(delay_us));
    }

    /// Time has passed: an attempt over its deadline is dropped, a reconnection due starts.
    pub fn handle_timeout(&mut self, now_us: u64) {
        if self.deadline_us.is_some_and(|due_us| now_us >= due_us) {
            let timeout_us = self.rules.connect_timeout_us.unwrap_or(0);
            let ended = Ended {
                why: format!(
                    "no connection to {} within {} ms",
                    self.rules.peer_name,
                    timeout_us / 1000
                ),
                refused: false,
            };
            self.handle_closed(&ended.why, now_us);
            self.event = Some(LinkEvent::Drop(ended));
            return;
        }
        if self.reconnect_us.is_some_and(|due_us| now_us >= due_us) {
            self.reconnect_us = None;
            self.event = Some(LinkEvent::Connect);
        }
    }

    /// Appends the bytes to send to `out` (taking over the buffer when `out` is empty);
    /// returns how many.
    pub fn poll_transmit(&mut self, out: &mut BytesMut) -> usize {
        let Some(seal) = self.seal.as_mut() else {
            return move_bytes(&mut self.transmit, out);
        };
        let before = out.len();
        let plain_len = std::mem::take(&mut self.plain_len).min(self.transmit.len());
        out.extend_from_slice(&self.transmit[..plain_len]);
        seal.seal(&self.transmit[plain_len..], out);
        self.transmit.clear();
        out.len() - before
    }

    /// What the IO side must do now, if anything.
    pub fn poll_event(&mut self) -> Option<LinkEvent> {
        self.event.take()
    }

    /// When [`LinkCore::handle_timeout`] must next be called: the attempt's deadline or the
    /// next attempt, whichever comes first.
    pub fn poll_timeout(&self) -> Option<u64> {
        match (self.deadline_us, self.reconnect_us) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// Moves the bytes of `from` to the end of `out` (taking over the buffer when `out` is empty,
/// so nothing is copied); returns how many.
pub(crate) fn move_bytes(from: &mut BytesMut, out: &mut BytesMut) -> usize {
    let len = from.len();
    if out.is_empty() {
        std::mem::swap(out, from);
    } else {
        out.extend_from_slice(from);
        from.clear();
    }
    len
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::frames_of;
    use crate::wire::Message;

    const MASTER: &[Role] = &[Role::Master];

    fn rules(secret: Option<Secret>) -> LinkRules {
        LinkRules {
            role: Role::Worker,
            peer_roles: MASTER,
            secret,
            label: "worker w1".into(),
            peer_name: "the master",
            peer_addr: ([127, 0, 0, 1], 7077).into(),
            connect_timeout_us: Some(3_000_000),
            backoff: Some(Backoff::new(BACKOFF_INITIAL, Duration::from_millis(200))),
        }
    }

    fn sent(core: &mut LinkCore) -> Vec<Frame> {
        let mut out = BytesMut::new();
        core.poll_transmit(&mut out);
        frames_of(&out)
    }

    /// Plays the master's side of the handshake; returns what the core said at the end.
    fn handshake(core: &mut LinkCore, secret: Option<Secret>, now_us: u64) -> Result<Role, Ended> {
        let mut to_core = BytesMut::new();
        let mut master =
            Handshake::accept(Role::Master, secret, [9; 32], &[Role::Worker], &mut to_core);
        for _ in 0..4 {
            for frame in frames_of(&to_core.split()) {
                match core.handle_frame(&frame, now_us)? {
                    Received::Opened(role) => return Ok(role),
                    Received::Handshake => {}
                    Received::Message => panic!("a message during the handshake"),
                }
            }
            for frame in sent(core) {
                // The master's own verdict shows in the core's next step.
                let _ = master.on_frame(frame.kind(), frame.body(), &mut to_core);
            }
        }
        panic!("the handshake did not finish");
    }

    #[test]
    fn the_handshake_opens_with_or_without_a_secret_and_then_frames_pass() {
        for secret in [None, Some(Secret::new("s3cret").expect("secret"))] {
            let mut core = LinkCore::new(rules(secret.clone()));
            assert_eq!(core.poll_event(), Some(LinkEvent::Connect));
            core.handle_connected([1; 32], 10);
            assert!(
                core.outbound().is_none(),
                "nothing to append before the handshake"
            );
            assert_eq!(handshake(&mut core, secret, 20), Ok(Role::Master));
            assert!(core.is_open() && !core.is_established());
            let mut bytes = BytesMut::new();
            Message::HeartbeatAck {}
                .encode(&mut bytes, 1 << 20)
                .expect("encodes");
            let frame = frames_of(&bytes).remove(0);
            assert_eq!(core.handle_frame(&frame, 30), Ok(Received::Message));
        }
    }

    #[test]
    fn a_wrong_secret_is_refused_and_the_peer_told_why() {
        let mut core = LinkCore::new(rules(Some(Secret::new("a").expect("a"))));
        core.handle_connected([1; 32], 0);
        let ended =
            handshake(&mut core, Some(Secret::new("b").expect("b")), 0).expect_err("refused");
        assert!(ended.refused, "{ended:?}");
        assert!(ended.why.contains("wrong shared secret"), "{}", ended.why);
        // The master checked the worker's proof first and told it why.
        assert!(ended.why.contains("the peer refused"), "{}", ended.why);
    }

    #[test]
    fn a_full_table_is_not_a_refusal_worth_giving_up_on() {
        let mut core = LinkCore::new(rules(None));
        core.handle_connected([1; 32], 0);
        let mut bytes = BytesMut::new();
        let full = Message::HandshakeRefused { reason: TABLE_FULL };
        full.encode(&mut bytes, 1 << 20).expect("encodes");
        let ended = core
            .handle_frame(&frames_of(&bytes).remove(0), 0)
            .expect_err("ends");
        assert!(!ended.refused, "{ended:?}");
    }

    #[test]
    fn reconnections_back_off_and_start_over_once_established() {
        let mut core = LinkCore::new(rules(None));
        assert_eq!(core.poll_event(), Some(LinkEvent::Connect));
        let mut now_us = 0;
        let mut waits_us = Vec::new();
        for _ in 0..4 {
            core.handle_connected([1; 32], now_us);
            core.handle_closed("refused", now_us);
            let due_us = core.poll_timeout().expect("the next attempt is scheduled");
            waits_us.push(due_us - now_us);
            core.handle_timeout(due_us - 1);
            assert_eq!(core.poll_event(), None, "not due yet");
            core.handle_timeout(due_us);
            assert_eq!(core.poll_event(), Some(LinkEvent::Connect));
            now_us = due_us;
        }
        assert_eq!(waits_us, [50_000, 100_000, 200_000, 200_000]);
        core.handle_connected([1; 32], now_us);
        handshake(&mut core, None, now_us).expect("opens");
        core.handle_established();
        assert!(core.is_established());
        assert_eq!(core.poll_timeout(), None, "no deadline once established");
        core.handle_closed("lost", now_us);
        assert_eq!(
            core.poll_timeout(),
            Some(now_us + 50_000),
            "the backoff starts over"
        );
        core.stop_reconnecting();
        assert_eq!(core.poll_timeout(), None, "stopped: no more attempts");
    }

    #[test]
    fn an_attempt_past_its_deadline_is_dropped_and_retried() {
        let mut core = LinkCore::new(rules(None));
        core.handle_connected([1; 32], 1_000);
        assert_eq!(core.poll_timeout(), Some(3_001_000));
        core.handle_timeout(3_001_000);
        let Some(LinkEvent::Drop(ended)) = core.poll_event() else {
            panic!("the attempt is dropped");
        };
        assert!(ended.why.contains("within 3000 ms"), "{}", ended.why);
        assert_eq!(core.poll_timeout(), Some(3_001_000 + 50_000));
    }

    #[test]
    fn a_link_without_backoff_never_reconnects() {
        let mut core = LinkCore::new(LinkRules {
            backoff: None,
            connect_timeout_us: None,
            ..rules(None)
        });
        core.handle_connected([1; 32], 0);
        assert_eq!(core.poll_timeout(), None);
        core.handle_closed("gone", 5);
        assert_eq!(core.poll_timeout(), None);
        assert_eq!(core.poll_event(), None);
    }

    #[test]
    fn silence_is_counted_from_the_last_frame_in_heartbeat_intervals() {
        let rule = Silence { intervals: 15 };
        let interval = Duration::from_millis(100);
        assert_eq!(rule.limit(interval), Duration::from_millis(1500));
        let mut core = LinkCore::new(rules(None));
        core.handle_connected([1; 32], 0);
        let mut hello = BytesMut::new();
        Handshake::accept(Role::Master, None, [9; 32], &[Role::Worker], &mut hello);
        core.handle_frame(&frames_of(&hello).remove(0), 1_000_000)
            .expect("a Hello");
        assert!(!core.is_silent(rule, interval, 2_500_000));
        assert!(core.is_silent(rule, interval, 2_500_001));
    }

    #[test]
    fn the_backoff_doubles_up_to_its_maximum_and_starts_over_when_established() {
        let mut backoff = Backoff::new(BACKOFF_INITIAL, Duration::from_millis(300));
        let waits: Vec<u128> = (0..5).map(|_| backoff.next_delay().as_millis()).collect();
        assert_eq!(waits, [50, 100, 200, 300, 300]);
        assert_eq!(backoff.failed(), 1);
        assert_eq!(backoff.failed(), 2);
        backoff.reset();
        assert_eq!(backoff.failed(), 1, "the count starts over");
        assert_eq!(backoff.next_delay(), BACKOFF_INITIAL);
    }

    #[test]
    fn the_logged_wait_is_the_one_taken() {
        let mut backoff = Backoff::new(BACKOFF_INITIAL, Duration::from_secs(2));
        for _ in 0..3 {
            let logged = backoff.peek();
            assert_eq!(backoff.next_delay(), logged);
        }
        assert_eq!(backoff.peek(), Duration::from_millis(400));
    }

    #[test]
    fn a_maximum_below_the_initial_wait_keeps_the_initial_wait() {
        let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_millis(10));
        assert_eq!(backoff.next_delay(), Duration::from_millis(50));
        assert_eq!(backoff.next_delay(), Duration::from_millis(50));
    }
}
