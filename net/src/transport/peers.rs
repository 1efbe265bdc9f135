//! The sans-IO half of the server side: a listening role's peer table, through the handshake
//! and past it, with its limits and deadlines. No sockets and no clock: every input carries
//! `now_us`, and what it decides waits to be polled, so a simulator drives it with bytes.
//!
//! Contract. The IO layer names each connection with a key `K` it does not reuse while the
//! table knows it, and hands in [`Peers::handle_connected`] (with a fresh nonce: our `Hello` is
//! queued at once), [`Peers::handle_frame`] and [`Peers::remove`] (the IO lost the peer). The
//! role answers a finished handshake with [`Peers::open`] (its state `S` and [`Standing`]) or
//! [`Peers::refuse`], changes a peer's standing with [`Peers::set_standing`] (registered: a
//! member), appends frames with [`Peers::send`] or [`Peers::outbound`], closes with
//! [`Peers::close`]. Outputs: [`Peers::poll_transmit`] (frames per peer; a closed peer's last
//! ones first), [`Peers::poll_close`] (connections for the IO to drop once written),
//! [`Peers::poll_gone`] (open peers the table closed itself: the role forgets them) and
//! [`Peers::poll_timeout`] (when [`Peers::handle_timeout`] is due; `None` with no peers).
//!
//! Limits: at most `handshakes_max` connections in the handshake and `clients_max`
//! [`Standing::Client`] peers (the oldest of a kind goes when another arrives, told
//! `HandshakeRefused{connection table full (LIMIT)}`), at most `connections_max` in all (a full
//! table evicts the oldest handshake or client, or refuses the newcomer). Deadlines: the
//! handshake and a [`Standing::Registering`] peer's registration within `handshake_timeout` of
//! the connect, a client silent for `client_idle_timeout`, a member silent for
//! `member_timeout` (if set) are closed.

use std::collections::VecDeque;
use std::hash::Hash;
use std::time::Duration;

use bytes::BytesMut;
use flint_engine::ids::IdMap;
use mio::Token;

use crate::conn::{ConnError, Inbound, TABLE_FULL};
use crate::handshake::Handshake;
use crate::seal::Seal;
use crate::transport::encode;
use crate::wire::{Frame, Message, Role};

/// How a peer past the handshake counts against the limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Must register within the handshake timeout (counted from the connect).
    Registering,
    /// A short-lived client (`flint status`): at most `clients_max`, the oldest evicted, closed
    /// when silent for the idle timeout, evictable when the table is full.
    Client,
    /// A registered peer (a worker, an application, an executor): never evicted; closed when
    /// silent for `member_timeout`, if there is one.
    Member,
}

/// The bounds of a peer table.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Connections held at once.
    pub connections_max: usize,
    /// Connections still in the handshake held at once (the oldest goes).
    pub handshakes_max: usize,
    /// [`Standing::Client`] peers held at once (the oldest goes).
    pub clients_max: usize,
    /// Time from the connect to the end of the handshake and the registration.
    pub handshake_timeout: Duration,
    /// A client silent this long is closed.
    pub client_idle_timeout: Duration,
    /// A member silent this long is closed (the driver's heartbeat timeout); `None`: never
    /// (the role expires its members itself).
    pub member_timeout: Option<Duration>,
}

/// Who a table is and whom it lets in.
#[derive(Debug, Clone)]
pub struct PeersConfig {
    /// Our role, the roles a peer may have, the secret, the largest frame sent.
    pub inbound: Inbound,
    /// Who refuses a newcomer to a full table ("the driver").
    pub name: &'static str,
    /// The bounds.
    pub limits: Limits,
}

/// What a frame was, as far as the table is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// A frame from an open peer: the role's to handle.
    Open,
    /// A step of the handshake; more to come.
    Handshaking,
    /// The handshake finished as this role: the role calls [`Peers::open`] or [`Peers::refuse`].
    Opened(Role),
    /// The handshake failed: the peer is closed (in [`Peers::poll_close`]).
    Failed,
    /// Not (or no longer) a peer: the IO layer drops it (in [`Peers::poll_close`]).
    Unknown,
}

enum Phase<S> {
    Handshake(Box<Handshake>),
    Open(S),
}

struct Peer<S> {
    phase: Phase<S>,
    standing: Standing,
    opened_us: u64,
    last_heard_us: u64,
    /// Frames encoded for it and not yet polled.
    out: BytesMut,
    /// Whether it is in the transmit queue.
    queued: bool,
    /// The connection's seal, once its handshake has made one (see [`crate::seal`]).
    seal: Option<Box<Seal>>,
    /// Bytes at the head of `out` sent as they are: the handshake's last frames.
    plain_len: usize,
}

impl<S> Peer<S> {
    /// Its frames to send, sealed when the connection is.
    #[inline]
    fn take_out(&mut self) -> BytesMut {
        let mut out = std::mem::take(&mut self.out);
        let plain_len = std::mem::take(&mut self.plain_len).min(out.len());
        if let Some(seal) = self.seal.as_mut() {
            let tail = out.split_off(plain_len);
            seal.seal(&tail, &mut out);
        }
        out
    }
}

/// Queues `peer` (its record `found`) on `transmit` for polling, unless it is queued already.
#[inline]
fn queue_once<K, S>(transmit: &mut VecDeque<K>, peer: K, found: &mut Peer<S>) {
    if !found.queued {
        found.queued = true;
        transmit.push_back(peer);
    }
}

/// The largest buffer [`Peers::recycle`] keeps for a peer's next frames (bytes).
pub const SPARE_OUT_MAX: usize = 64 * 1024;

/// A peer table's key: a connection number the IO layer hands out, in increasing order as a
/// rule (so the table is an [`IdMap`]), and never reuses while the table knows the peer.
pub trait PeerKey: Copy + Eq + Hash + Ord + std::fmt::Debug {
    /// The number.
    fn number(self) -> u64;
    /// The key of number `n`.
    fn from_number(n: u64) -> Self;
}

impl PeerKey for Token {
    fn number(self) -> u64 {
        self.0 as u64
    }
    fn from_number(n: u64) -> Self {
        Token(n as usize)
    }
}

/// A peer table keyed by `K`; `S` is the role's state for each open peer.
pub struct Peers<K, S> {
    config: PeersConfig,
    /// By key (the IO layer's connection numbers, handed out in increasing order, never a
    /// peer's bytes).
    peers: IdMap<Peer<S>>,
    /// Peers with frames to poll, in the order they got them.
    transmit: VecDeque<K>,
    /// Closed peers' last frames (a refusal, say), polled before anything else.
    farewells: VecDeque<(K, BytesMut)>,
    closes: VecDeque<(K, ConnError)>,
    gone: VecDeque<(K, S, ConnError)>,
    /// No deadline is before this.
    next_check_us: Option<u64>,
}

impl<K, S> std::fmt::Debug for Peers<K, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peers")
            .field("name", &self.config.name)
            .field("peers", &self.peers.len())
            .finish_non_exhaustive()
    }
}

impl<K: PeerKey, S> Peers<K, S> {
    /// An empty table.
    pub fn new(config: PeersConfig) -> Self {
        Peers {
            config,
            peers: IdMap::new(),
            transmit: VecDeque::new(),
            farewells: VecDeque::new(),
            closes: VecDeque::new(),
            gone: VecDeque::new(),
            next_check_us: None,
        }
    }

    /// Peers held (in the handshake or past it).
    pub fn len(&self) -> usize {
        self.peers.len()
    }

    /// Whether it holds no peer.
    pub fn is_empty(&self) -> bool {
        self.peers.is_empty()
    }

    /// Whether it holds `peer` (in the handshake or past it).
    pub fn contains(&self, peer: K) -> bool {
        self.peers.contains_key(peer.number())
    }

    /// The open peers' states, in no order.
    pub fn states(&self) -> impl Iterator<Item = &S> + '_ {
        self.peers.values().filter_map(|p| match &p.phase {
            Phase::Open(state) => Some(state),
            Phase::Handshake(_) => None,
        })
    }

    /// Whether anything waits to be polled.
    pub fn has_output(&self) -> bool {
        let queues = [self.transmit.len(), self.farewells.len(), self.closes.len()];
        queues.iter().any(|&n| n > 0) || !self.gone.is_empty()
    }

    /// The peers held, in no order.
    pub fn keys(&self) -> impl Iterator<Item = K> + '_ {
        self.peers.keys().map(K::from_number)
    }

    /// A connection arrived; `nonce` is fresh for it, our `Hello` is queued at once. A full
    /// table with nothing to evict refuses it with the reason (the IO layer tells the peer
    /// and drops it); making room may close older connections.
    pub fn handle_connected(
        &mut self,
        peer: K,
        nonce: [u8; 32],
        now_us: u64,
    ) -> Result<(), String> {
        let handshaking = |p: &Peer<S>| matches!(p.phase, Phase::Handshake(_));
        if self.count(handshaking) >= self.config.limits.handshakes_max {
            self.evict_oldest(handshaking, "handshakes_max");
        }
        if self.peers.len() >= self.config.limits.connections_max
            && !self.evict_oldest(evictable::<S>, "connections_max")
        {
            tracing::warn!("refused a connection: {TABLE_FULL} (connections_max)");
            let (name, held) = (self.config.name, self.peers.len());
            return Err(format!("{TABLE_FULL}: {name} holds {held} connections"));
        }
        let mut out = BytesMut::new();
        let inbound = &self.config.inbound;
        let handshake = Handshake::accept(
            inbound.role,
            inbound.secret.clone(),
            nonce,
            inbound.accepted_roles,
            &mut out,
        );
        let state = Peer {
            phase: Phase::Handshake(Box::new(handshake)),
            standing: Standing::Registering,
            opened_us: now_us,
            last_heard_us: now_us,
            out,
            queued: false,
            seal: None,
            plain_len: 0,
        };
        self.peers.insert(peer.number(), state);
        self.queue(peer);
        self.watch(expiry(now_us, self.config.limits.handshake_timeout));
        self.check();
        Ok(())
    }

    /// Why a connection arriving now would be refused: the table is full and holds no
    /// handshake or client to evict. (The IO layer may ask before it sets a connection up.)
    pub fn refusal(&self) -> Option<String> {
        let full = self.peers.len() >= self.config.limits.connections_max;
        if !full || self.peers.values().any(evictable) {
            return None;
        }
        let (name, held) = (self.config.name, self.peers.len());
        Some(format!("{TABLE_FULL}: {name} holds {held} connections"))
    }

    /// A frame from a peer: a step of its handshake, or the role's (see [`Arrival`]).
    pub fn handle_frame(&mut self, peer: K, frame: &Frame, now_us: u64) -> Arrival {
        let Some(state) = self.peers.get_mut(peer.number()) else {
            self.closes
                .push_back((peer, ConnError::Protocol("unknown peer".into())));
            return Arrival::Unknown;
        };
        state.last_heard_us = state.last_heard_us.max(now_us);
        let Phase::Handshake(handshake) = &mut state.phase else {
            return Arrival::Open;
        };
        let step = handshake.on_frame(frame.kind(), frame.body(), &mut state.out);
        if let Ok(Some(_)) = step {
            state.seal = handshake.take_seal().map(Box::new);
            state.plain_len = state.out.len();
        }
        self.queue(peer);
        match step {
            Ok(None) => Arrival::Handshaking,
            Ok(Some(role)) => Arrival::Opened(role),
            Err(error) => {
                let why = ConnError::Protocol(format!("handshake failed: {error}"));
                self.close(peer, why);
                Arrival::Failed
            }
        }
    }

    /// The frame to hand to [`Peers::handle_frame`]: opened if the peer's connection is sealed
    /// (see [`crate::seal`]), else as it came. `None`: its seal is wrong (injected, changed,
    /// replayed, or a frame not sealed), and the peer is closed (in [`Peers::poll_gone`]).
    pub fn unseal(&mut self, peer: K, frame: &Frame) -> Option<Frame> {
        let opened = match self
            .peers
            .get_mut(peer.number())
            .and_then(|p| p.seal.as_mut())
        {
            None => return Some(frame.clone()),
            Some(seal) => seal.open(frame),
        };
        match opened {
            Ok(frame) => Some(frame),
            Err(error) => {
                tracing::warn!(?peer, "closed a sealed connection: {error}");
                self.close_gone(peer, ConnError::Protocol(error.to_string()));
                None
            }
        }
    }

    /// Opens a peer whose handshake finished: its state and standing. A client beyond
    /// `clients_max` evicts the oldest one.
    pub fn open(&mut self, peer: K, state: S, standing: Standing) {
        if standing == Standing::Client {
            let client =
                |p: &Peer<S>| matches!(p.phase, Phase::Open(_)) && p.standing == Standing::Client;
            if self.count(client) >= self.config.limits.clients_max {
                self.evict_oldest(client, "clients_max");
            }
        }
        if let Some(found) = self.peers.get_mut(peer.number()) {
            found.phase = Phase::Open(state);
        }
        self.set_standing(peer, standing);
        self.check();
    }

    /// Refuses a peer whose handshake finished: it is told why (`HandshakeRefused`), then
    /// closed.
    pub fn refuse(&mut self, peer: K, reason: String) {
        self.send(peer, &Message::HandshakeRefused { reason: &reason });
        self.close(peer, ConnError::Protocol(reason));
    }

    /// How a peer counts from now on; its deadline runs from its last word.
    pub fn set_standing(&mut self, peer: K, standing: Standing) {
        let Some(found) = self.peers.get_mut(peer.number()) else {
            return;
        };
        found.standing = standing;
        // Silence counts from the last word (a demoted peer may have been quiet a while).
        let since_us = found.last_heard_us;
        let limits = &self.config.limits;
        let timeout = match standing {
            Standing::Registering => None,
            Standing::Client => Some(limits.client_idle_timeout),
            Standing::Member => limits.member_timeout,
        };
        if let Some(timeout) = timeout {
            self.watch(expiry(since_us, timeout));
        }
    }

    /// How a peer counts now.
    pub fn standing(&self, peer: K) -> Option<Standing> {
        Some(self.peers.get(peer.number())?.standing)
    }

    /// An open peer's state.
    pub fn state(&self, peer: K) -> Option<&S> {
        match &self.peers.get(peer.number())?.phase {
            Phase::Open(state) => Some(state),
            Phase::Handshake(_) => None,
        }
    }

    /// An open peer's state and its outbound buffer, to append frames to (it is queued for
    /// [`Peers::poll_transmit`]).
    pub fn open_mut(&mut self, peer: K) -> Option<(&mut S, &mut BytesMut)> {
        let found = self.peers.get_mut(peer.number())?;
        queue_once(&mut self.transmit, peer, found);
        match &mut found.phase {
            Phase::Open(state) => Some((state, &mut found.out)),
            Phase::Handshake(_) => None,
        }
    }

    /// A peer's outbound buffer, to append frames to (it is queued for
    /// [`Peers::poll_transmit`]); `None` once it is closed.
    pub fn outbound(&mut self, peer: K) -> Option<&mut BytesMut> {
        let found = self.peers.get_mut(peer.number())?;
        queue_once(&mut self.transmit, peer, found);
        Some(&mut found.out)
    }

    /// Encodes a message for a peer.
    pub fn send(&mut self, peer: K, message: &Message<'_>) {
        let frame_size_max = self.config.inbound.frame_size_max;
        if let Some(out) = self.outbound(peer) {
            encode(message, out, frame_size_max);
        }
    }

    /// Closes a peer: its last frames go out, then the IO layer drops it
    /// ([`Peers::poll_close`]). The state of an open peer is handed back.
    pub fn close(&mut self, peer: K, why: ConnError) -> Option<S> {
        let mut state = self.peers.remove(peer.number())?;
        let out = state.take_out();
        if !out.is_empty() {
            self.farewells.push_back((peer, out));
        }
        self.closes.push_back((peer, why));
        match state.phase {
            Phase::Open(state) => Some(state),
            Phase::Handshake(_) => None,
        }
    }

    /// The IO layer lost a peer: it is forgotten, nothing more goes to it. The state of an
    /// open peer is handed back.
    pub fn remove(&mut self, peer: K) -> Option<S> {
        match self.peers.remove(peer.number())?.phase {
            Phase::Open(state) => Some(state),
            Phase::Handshake(_) => None,
        }
    }

    /// Time passed: closes the peers past their deadline. O(peers), once per earliest deadline.
    pub fn handle_timeout(&mut self, now_us: u64) {
        if self.next_check_us.is_none_or(|t| t > now_us) {
            return;
        }
        let limits = &self.config.limits;
        let mut expired = Vec::new();
        let mut next: Option<u64> = None;
        for (key, peer) in self.peers.iter() {
            // A peer in the handshake is registering.
            let (since_us, timeout, what) = match peer.standing {
                Standing::Registering => (
                    peer.opened_us,
                    limits.handshake_timeout,
                    "no handshake and registration within",
                ),
                Standing::Client => (
                    peer.last_heard_us,
                    limits.client_idle_timeout,
                    "a client connection silent for",
                ),
                Standing::Member => match limits.member_timeout {
                    Some(timeout) => (peer.last_heard_us, timeout, "no heartbeat for"),
                    None => continue,
                },
            };
            let at_us = expiry(since_us, timeout);
            if at_us <= now_us {
                let key = K::from_number(key);
                expired.push((key, format!("{what} {} ms", timeout.as_millis())));
            } else {
                next = Some(next.map_or(at_us, |t| t.min(at_us)));
            }
        }
        self.next_check_us = next;
        expired.sort();
        for (key, why) in expired {
            self.close_gone(key, ConnError::Protocol(why));
        }
        self.check();
        debug_assert!(
            self.next_check_us.is_none_or(|t| t > now_us),
            "a deadline in the past"
        );
    }

    /// When [`Peers::handle_timeout`] is next due; `None` while no peer has a deadline.
    pub fn poll_timeout(&self) -> Option<u64> {
        self.next_check_us
    }

    /// Hands back a buffer once the frames [`Peers::poll_transmit`] gave out are on their
    /// connection (what it still holds is dropped): `peer`'s next frames are encoded into it
    /// instead of a new one that grows frame by frame. Optional; a buffer over
    /// [`SPARE_OUT_MAX`] bytes, or one for a peer that has frames again, is dropped.
    pub fn recycle(&mut self, peer: K, mut spare: BytesMut) {
        let Some(p) = self.peers.get_mut(peer.number()) else {
            return;
        };
        if p.out.is_empty()
            && p.out.capacity() < spare.capacity()
            && spare.capacity() <= SPARE_OUT_MAX
        {
            spare.clear();
            p.out = spare;
        }
    }

    /// The next peer with frames to send, and the frames (append them to its connection).
    pub fn poll_transmit(&mut self) -> Option<(K, BytesMut)> {
        if let Some(farewell) = self.farewells.pop_front() {
            return Some(farewell);
        }
        while let Some(peer) = self.transmit.pop_front() {
            let Some(state) = self.peers.get_mut(peer.number()) else {
                continue;
            };
            state.queued = false;
            if !state.out.is_empty() {
                return Some((peer, state.take_out()));
            }
        }
        None
    }

    /// The next connection to drop, and why: the IO layer writes what it has for it (drain
    /// [`Peers::poll_transmit`] first), then drops it. The table has forgotten it.
    pub fn poll_close(&mut self) -> Option<(K, ConnError)> {
        self.closes.pop_front()
    }

    /// The next open peer the table closed itself (evicted, expired), with its state: the role
    /// forgets it.
    pub fn poll_gone(&mut self) -> Option<(K, S, ConnError)> {
        self.gone.pop_front()
    }

    /// Closes a peer the role did not ask to close: an open one goes to [`Peers::poll_gone`].
    /// What must hold between inputs (checked in debug builds, and by the simulators, which
    /// run with assertions on): the table within its bounds, a peer that says it is queued in
    /// the transmit queue, no member or client before its handshake ends. O(peers).
    pub(crate) fn check(&self) {
        if !cfg!(debug_assertions) {
            return;
        }
        let limits = &self.config.limits;
        let handshakes = self.count(|p| matches!(p.phase, Phase::Handshake(_)));
        let clients = self.count(|p| p.standing == Standing::Client);
        assert!(
            handshakes <= limits.handshakes_max,
            "{handshakes} handshakes"
        );
        assert!(clients <= limits.clients_max, "{clients} clients");
        assert!(
            self.peers.len() <= limits.connections_max,
            "{} peers",
            self.peers.len()
        );
        // The queue may still name peers that left (dropped when polled), never miss one
        // that says it is queued.
        let in_queue: std::collections::HashSet<&K> = self.transmit.iter().collect();
        for (key, peer) in self.peers.iter() {
            assert!(
                !peer.queued || in_queue.contains(&K::from_number(key)),
                "a queued peer is in the queue"
            );
        }
        for peer in self.peers.values() {
            let open = matches!(peer.phase, Phase::Open(_));
            // Never: a member or a client that has not finished its handshake.
            assert!(
                open || peer.standing == Standing::Registering,
                "standing before open"
            );
        }
    }

    fn close_gone(&mut self, peer: K, why: ConnError) {
        let reason = why.to_string();
        if let Some(state) = self.close(peer, why) {
            self.gone
                .push_back((peer, state, ConnError::Protocol(reason)));
        } else {
            tracing::info!(?peer, "dropped a connection: {reason}");
        }
    }

    /// Puts a peer with frames in the transmit queue (once).
    fn queue(&mut self, peer: K) {
        if self
            .peers
            .get(peer.number())
            .is_some_and(|p| !p.out.is_empty())
        {
            self.queue_once(peer);
        }
    }

    fn queue_once(&mut self, peer: K) {
        if let Some(found) = self.peers.get_mut(peer.number()) {
            queue_once(&mut self.transmit, peer, found);
        }
    }

    /// Peers matching.
    fn count(&self, matching: impl Fn(&Peer<S>) -> bool) -> usize {
        self.peers.values().filter(|p| matching(p)).count()
    }

    /// Closes the oldest peer matching, telling it the table is full; whether there was one.
    fn evict_oldest(&mut self, matching: impl Fn(&Peer<S>) -> bool, limit: &str) -> bool {
        let oldest = (self.peers.iter())
            .filter(|(_, p)| matching(p))
            .min_by_key(|(key, p)| (p.opened_us, *key))
            .map(|(key, _)| K::from_number(key));
        let Some(peer) = oldest else {
            return false;
        };
        let reason = format!("{TABLE_FULL} ({limit}): the oldest such connection goes");
        self.send(peer, &Message::HandshakeRefused { reason: &reason });
        tracing::debug!(?peer, "dropped the oldest connection of its kind: {reason}");
        self.close_gone(peer, ConnError::Protocol(reason));
        true
    }

    /// No deadline is before `at_us` unless one already was.
    fn watch(&mut self, at_us: u64) {
        let next = self.next_check_us.map_or(at_us, |t| t.min(at_us));
        self.next_check_us = Some(next);
    }
}

/// What a full table may evict: a connection in the handshake or a client.
fn evictable<S>(peer: &Peer<S>) -> bool {
    matches!(peer.phase, Phase::Handshake(_)) || peer.standing == Standing::Client
}

/// When something last seen at `since_us` expires: once strictly more than `timeout` passed.
fn expiry(since_us: u64, timeout: Duration) -> u64 {
    let timeout_us = u64::try_from(timeout.as_micros()).unwrap_or(u64::MAX);
    since_us.saturating_add(timeout_us).saturating_add(1)
}

#[cfg(test)]
mod tests {
    //! The table alone: the peer's side of the handshake played with [`Handshake`], time
    //! simulated.

    use super::*;
    use crate::transport::frames_of;

    impl PeerKey for u32 {
        fn number(self) -> u64 {
            u64::from(self)
        }
        fn from_number(n: u64) -> Self {
            n as u32
        }
    }
    use crate::wire::FRAME_SIZE_MAX_DEFAULT;

    const MS: u64 = 1_000;

    fn table(connections_max: usize, handshakes_max: usize, clients_max: usize) -> Peers<u32, ()> {
        let inbound = Inbound {
            role: Role::Driver,
            accepted_roles: &[Role::Executor, Role::Client],
            secret: None,
            frame_size_max: FRAME_SIZE_MAX_DEFAULT,
            outbound_max: 1 << 20,
        };
        Peers::new(PeersConfig {
            inbound,
            name: "the test",
            limits: Limits {
                connections_max,
                handshakes_max,
                clients_max,
                handshake_timeout: Duration::from_millis(100),
                client_idle_timeout: Duration::from_millis(300),
                member_timeout: Some(Duration::from_millis(200)),
            },
        })
    }

    /// Everything queued for `peer` (the rest is dropped).
    fn sent_to(peers: &mut Peers<u32, ()>, peer: u32) -> Vec<Frame> {
        let mut frames = Vec::new();
        while let Some((to, bytes)) = peers.poll_transmit() {
            if to == peer {
                frames.extend(frames_of(&bytes));
            }
        }
        frames
    }

    /// Connects `peer` and plays its side of the handshake as `role`; what the table said.
    fn handshake(peers: &mut Peers<u32, ()>, peer: u32, role: Role, now_us: u64) -> Arrival {
        peers.handle_connected(peer, [1; 32], now_us).expect("room");
        let mut out = BytesMut::new();
        let mut ours = Handshake::connect(role, None, [2; 32], &[Role::Driver], &mut out);
        for frame in sent_to(peers, peer) {
            ours.on_frame(frame.kind(), frame.body(), &mut out)
                .expect("the table's Hello is valid");
        }
        let mut arrival = Arrival::Handshaking;
        for frame in frames_of(&out) {
            arrival = peers.handle_frame(peer, &frame, now_us);
        }
        arrival
    }

    fn refusal(frames: &[Frame]) -> Option<String> {
        frames.iter().find_map(|f| match f.message() {
            Ok(Message::HandshakeRefused { reason }) => Some(reason.to_owned()),
            _ => None,
        })
    }

    fn closed(peers: &mut Peers<u32, ()>) -> Vec<u32> {
        std::iter::from_fn(|| peers.poll_close().map(|(peer, _)| peer)).collect()
    }

    #[test]
    fn a_finished_handshake_names_the_role_and_the_role_opens_the_peer() {
        let mut peers = table(8, 8, 8);
        assert_eq!(
            handshake(&mut peers, 1, Role::Executor, 0),
            Arrival::Opened(Role::Executor)
        );
        assert!(peers.state(1).is_none(), "not open until the role says so");
        peers.open(1, (), Standing::Registering);
        assert_eq!(peers.state(1), Some(&()));
        assert_eq!(peers.standing(1), Some(Standing::Registering));
        let frame = frames_of(&{
            let mut out = BytesMut::new();
            encode(&Message::Shutdown {}, &mut out, FRAME_SIZE_MAX_DEFAULT);
            out
        })
        .remove(0);
        assert_eq!(peers.handle_frame(1, &frame, MS), Arrival::Open);
        assert_eq!(peers.handle_frame(9, &frame, MS), Arrival::Unknown);
        assert_eq!(closed(&mut peers), vec![9], "an unknown peer is dropped");
    }

    #[test]
    fn a_recycled_buffer_takes_the_peers_next_frames_and_a_big_one_is_dropped() {
        let mut peers = table(8, 8, 8);
        handshake(&mut peers, 1, Role::Executor, 0);
        peers.open(1, (), Standing::Member);
        let beat = Message::HeartbeatAck {};
        peers.send(1, &beat);
        let (_, sent) = peers.poll_transmit().expect("frames for peer 1");
        // The IO layer wrote them and hands back a buffer with room.
        let mut spare = BytesMut::with_capacity(4096);
        spare.extend_from_slice(b"already written");
        let kept = spare.as_ptr();
        peers.recycle(1, spare);
        peers.send(1, &beat);
        let (_, next) = peers.poll_transmit().expect("frames for peer 1");
        assert_eq!(next.as_ptr(), kept, "encoded into the recycled buffer");
        assert_eq!(frames_of(&next).len(), 1, "holding only the new frame");
        assert_eq!(&next[..], &sent[..], "the same frame as before");
        peers.recycle(1, BytesMut::with_capacity(SPARE_OUT_MAX + 1));
        peers.send(1, &beat);
        let (_, after) = peers.poll_transmit().expect("frames for peer 1");
        assert!(after.capacity() <= SPARE_OUT_MAX, "too big to keep");
    }

    #[test]
    fn the_oldest_handshake_goes_over_handshakes_max_and_is_told_why() {
        let mut peers = table(8, 2, 8);
        for (peer, at_us) in [(1, 0), (2, MS), (3, 2 * MS)] {
            peers.handle_connected(peer, [1; 32], at_us).expect("room");
        }
        assert_eq!(closed(&mut peers), vec![1]);
        let reason = refusal(&sent_to(&mut peers, 1)).expect("the evicted peer is told");
        assert!(reason.starts_with(TABLE_FULL), "{reason}");
        assert!(reason.contains("handshakes_max"), "{reason}");
        assert_eq!(peers.len(), 2);
        assert!(
            peers.poll_gone().is_none(),
            "a handshake has no state to forget"
        );
    }

    #[test]
    fn a_client_over_clients_max_evicts_the_oldest_client_and_the_role_forgets_it() {
        let mut peers = table(8, 8, 1);
        for (peer, at_us) in [(1, 0), (2, MS)] {
            assert_eq!(
                handshake(&mut peers, peer, Role::Client, at_us),
                Arrival::Opened(Role::Client)
            );
            peers.open(peer, (), Standing::Client);
        }
        let gone = peers
            .poll_gone()
            .map(|(peer, _, why)| (peer, why.to_string()));
        let (peer, why) = gone.expect("the oldest client goes");
        assert_eq!(peer, 1);
        assert!(why.contains("clients_max"), "{why}");
        assert_eq!(closed(&mut peers), vec![1]);
        assert!(peers.contains(2));
    }

    #[test]
    fn a_full_table_evicts_a_handshake_or_a_client_and_never_a_member() {
        let mut peers = table(2, 8, 8);
        handshake(&mut peers, 1, Role::Executor, 0);
        peers.open(1, (), Standing::Member);
        peers.handle_connected(2, [1; 32], MS).expect("room");
        assert!(peers.refusal().is_none(), "a handshake can be evicted");
        // Peer 3 connects (evicting 2) and finishes its handshake.
        handshake(&mut peers, 3, Role::Executor, 2 * MS);
        assert_eq!(closed(&mut peers), vec![2]);
        peers.open(3, (), Standing::Member);
        let reason = peers.refusal().expect("only members left");
        assert!(reason.starts_with(TABLE_FULL), "{reason}");
        let refused = peers.handle_connected(4, [1; 32], 3 * MS);
        assert_eq!(refused, Err(reason));
        assert!(closed(&mut peers).is_empty(), "no member is evicted");
    }

    #[test]
    fn each_standing_expires_after_its_own_timeout_and_poll_timeout_says_when() {
        let mut peers = table(8, 8, 8);
        assert_eq!(peers.poll_timeout(), None, "no peers, no deadline");
        peers.handle_connected(1, [1; 32], 0).expect("room");
        assert_eq!(peers.poll_timeout(), Some(100 * MS + 1), "the handshake's");
        handshake(&mut peers, 2, Role::Client, 0);
        peers.open(2, (), Standing::Client);
        handshake(&mut peers, 3, Role::Executor, 0);
        peers.open(3, (), Standing::Member);
        peers.handle_timeout(100 * MS);
        assert!(
            closed(&mut peers).is_empty(),
            "not strictly past any deadline"
        );
        peers.handle_timeout(100 * MS + 1);
        assert_eq!(
            closed(&mut peers),
            vec![1],
            "the handshake not done in time"
        );
        assert_eq!(peers.poll_timeout(), Some(200 * MS + 1), "the member's");
        peers.handle_timeout(200 * MS + 1);
        let gone = peers
            .poll_gone()
            .map(|(peer, _, why)| (peer, why.to_string()));
        assert_eq!(gone, Some((3, "no heartbeat for 200 ms".into())));
        assert_eq!(closed(&mut peers), vec![3]);
        peers.handle_timeout(300 * MS + 1);
        assert_eq!(closed(&mut peers), vec![2], "the silent client");
        assert_eq!(peers.poll_timeout(), None);
    }

    #[test]
    fn a_failed_handshake_closes_the_peer() {
        let mut peers = table(8, 8, 8);
        peers.handle_connected(1, [1; 32], 0).expect("room");
        let mut out = BytesMut::new();
        // A driver may not connect to a driver.
        let _ = Handshake::connect(Role::Driver, None, [2; 32], &[Role::Driver], &mut out);
        let arrivals: Vec<Arrival> = (frames_of(&out).iter())
            .map(|frame| peers.handle_frame(1, frame, 0))
            .collect();
        assert_eq!(arrivals.last(), Some(&Arrival::Failed));
        assert_eq!(closed(&mut peers), vec![1]);
        assert!(!peers.contains(1));
    }
}
