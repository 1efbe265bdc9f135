//! The server side of the transport, its IO half: a listener and its connections on a loop,
//! around the sans-IO peer table ([`Peers`]: the handshake, the limits, the deadlines), for a
//! listening role whose frames a [`Handler`] interprets.
//!
//! Contract. A role builds a [`Server`] with an `Inbound` (its role, the roles it accepts, the
//! secret, frame and buffer bounds) and [`Limits`], and implements [`Handler`] for what the
//! frames mean. The server:
//! - accepts until the listener would block (a full table with nothing to evict refuses the
//!   newcomer with `HandshakeRefused{connection table full}` before setting it up) and hands
//!   each connection to the table, which runs the handshake; when it completes,
//!   [`Handler::on_open`] gives the peer its state `S` (or a reason to refuse it);
//! - reads until the socket would block: frames after the handshake go to
//!   [`Handler::on_frame`] as they complete, until the handler returns an error (which closes
//!   the peer);
//! - keeps the table's view of each peer's [`Handler::standing`] current before it applies the
//!   limits and the deadlines ([`Server::expire`], on the role's tick);
//! - writes: the role appends to [`Server::outbound`] and calls [`Server::flush`] once per
//!   event; a peer whose flush fails is closed;
//! - closes: [`Server::close`] (or any failure above, an eviction or an expiry) flushes what is
//!   queued, best effort, and tells the handler ([`Handler::on_closed`]) for peers past the
//!   handshake.
//!
//! Nothing here knows a role's messages. The driver and the master keep the table in their
//! sans-IO cores (`DriverCore`, `MasterCore`) and use [`Sockets`] alone; [`Server`] is the two
//! together for a role whose peers need no core of their own (the worker's status listener).
//! Peers are named by their `mio` [`Token`].

use std::time::{Duration, Instant};

use bytes::BytesMut;
use flint_engine::hash::FxHashSet;
use flint_engine::ids::IdMap;
use flint_engine::runtime::{Ctx, Endpoint};
use mio::event::Event;
use mio::net::TcpListener;
use mio::{Interest, Token};

use crate::conn::{accept_next, refuse, ConnError, Connection, Inbound, ReadUntil};
use crate::handshake::random_nonce;
use crate::transport::peers::{Arrival, PeerKey, Peers, PeersConfig};
pub use crate::transport::peers::{Limits, Standing};
use crate::wire::{Frame, Role};

/// What a role does with its peers' frames.
pub trait Handler<S> {
    /// A peer finished the handshake as `role`: its state, or why it is refused.
    fn on_open(&mut self, peer: Token, role: Role) -> Result<S, String>;
    /// A frame from a peer past the handshake; `out` is that peer's outbound buffer. An error
    /// closes the peer.
    fn on_frame(
        &mut self,
        peer: Token,
        state: &mut S,
        frame: Frame,
        out: &mut BytesMut,
    ) -> Result<(), ConnError>;
    /// A peer past the handshake is gone (its state is dropped after this).
    fn on_closed(&mut self, peer: Token, state: S, why: &ConnError);
    /// How the peer counts against the limits now.
    fn standing(&self, peer: Token, state: &S) -> Standing;
}

/// Who decides about newcomers: the role's sans-IO side.
pub trait Admit {
    /// Why a connection arriving now is refused, if it is (a full table).
    fn refusal(&mut self) -> Option<String>;
    /// A connection was set up at `now_us`: `nonce` is fresh for its handshake; an error
    /// closes it.
    fn connected(&mut self, token: Token, nonce: [u8; 32], now_us: u64) -> Result<(), String>;
}

/// The IO half of a listening role: a listener and its connections on a loop, named by their
/// token. It accepts, reads, appends and flushes; what the bytes mean and whom to let in is
/// the role's sans-IO side ([`Peers`], or a core embedding it). A connection with bytes queued
/// and none written for `stuck_timeout` (when the role watches it) is not reading:
/// [`Sockets::expire_stuck`] names it.
pub struct Sockets {
    listener: TcpListener,
    listener_token: Option<Token>,
    inbound: Inbound,
    conns: IdMap<Socket>,
    /// Connections to flush after this event.
    dirty: Vec<Token>,
    stuck_timeout_us: Option<u64>,
    /// Watched connections with bytes stuck (see [`Socket::write_stuck_since_us`]).
    stuck: FxHashSet<Token>,
    /// Connections closed since the last [`Sockets::release`]: their tokens are still the
    /// loop's until they are deregistered there.
    closed: Vec<(Token, Connection)>,
}

struct Socket {
    conn: Connection,
    /// Since when bytes have been queued for it with none written (a peer not reading).
    write_stuck_since_us: Option<u64>,
}

impl std::fmt::Debug for Sockets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sockets")
            .field("conns", &self.conns.len())
            .finish_non_exhaustive()
    }
}

impl Sockets {
    /// Connections accepted on `listener`, set up by `inbound`; `stuck_timeout` is how long a
    /// watched connection may have bytes queued and none written.
    pub fn new(listener: TcpListener, inbound: Inbound, stuck_timeout: Option<Duration>) -> Self {
        Sockets {
            listener,
            listener_token: None,
            inbound,
            conns: IdMap::new(),
            dirty: Vec::new(),
            stuck_timeout_us: stuck_timeout.map(us),
            stuck: FxHashSet::default(),
            closed: Vec::new(),
        }
    }

    /// Deregisters the connections closed since the last call from the loop, so their tokens
    /// do not pile up in it; the role calls it once per event, where it has the loop's context.
    pub fn release<E: Endpoint>(&mut self, ctx: &mut Ctx<'_, E>) {
        for (token, mut conn) in self.closed.drain(..) {
            let _ = ctx.deregister(conn.stream_mut(), token);
        }
    }

    /// Watches the listener on the endpoint's loop.
    pub fn start<E: Endpoint>(&mut self, ctx: &mut Ctx<'_, E>) -> Result<(), String> {
        let token = ctx
            .register(&mut self.listener, Interest::READABLE)
            .map_err(|e| format!("cannot watch the listener: {e}"))?;
        self.listener_token = Some(token);
        Ok(())
    }

    /// Whether `token` is the listener's.
    pub fn is_listener(&self, token: Token) -> bool {
        Some(token) == self.listener_token
    }

    /// Whether `token` is one of its connections.
    pub fn contains(&self, token: Token) -> bool {
        self.conns.contains_key(token.number())
    }

    /// Accepts until the listener would block. `admit` is asked first for each newcomer (a
    /// refusal is told with `HandshakeRefused` before anything is set up), then gets its token
    /// and a fresh nonce (an error closes it).
    pub fn accept<E: Endpoint>(
        &mut self,
        ctx: &mut Ctx<'_, E>,
        admit: &mut impl Admit,
        now_us: u64,
    ) {
        while let Some((stream, addr)) = accept_next(&self.listener) {
            if let Some(reason) = admit.refusal() {
                tracing::warn!(%addr, "refused a connection: {reason}");
                refuse(stream, &reason);
                continue;
            }
            let set_up = random_nonce()
                .map_err(|e| format!("no random nonce: {e}"))
                .and_then(|nonce| Ok((self.inbound.register(stream, ctx)?, nonce)));
            let ((token, conn), nonce) = match set_up {
                Ok(set_up) => set_up,
                Err(error) => {
                    tracing::warn!(%addr, "could not set up a connection: {error}");
                    continue;
                }
            };
            let socket = Socket {
                conn,
                write_stuck_since_us: None,
            };
            self.conns.insert(token.number(), socket);
            match admit.connected(token, nonce, now_us) {
                Ok(()) => self.dirty.push(token),
                Err(error) => {
                    tracing::warn!(%addr, "could not open a connection: {error}");
                    self.close(token);
                }
            }
        }
    }

    /// Reads a connection as far as `until` says (see [`ReadUntil`]) or until `on_frame`
    /// fails; the first error (the socket's or `on_frame`'s). The connection is flushed with
    /// the others.
    pub fn read(
        &mut self,
        token: Token,
        until: ReadUntil,
        mut on_frame: impl FnMut(Frame) -> Result<(), ConnError>,
    ) -> Result<(), ConnError> {
        let Some(socket) = self.conns.get_mut(token.number()) else {
            return Ok(());
        };
        self.dirty.push(token);
        socket
            .conn
            .read_frames_until(until, |_, frame| on_frame(frame))
    }

    /// Appends frames to a connection's outbound buffer (taking `frames` when it is empty).
    /// Returns a spare buffer to hand back to whoever encoded the frames (its bytes are no
    /// longer needed): the connection's emptied one, or `frames` once copied.
    pub fn append(&mut self, token: Token, mut frames: BytesMut) -> BytesMut {
        let Some(socket) = self.conns.get_mut(token.number()) else {
            return frames;
        };
        let outbound = socket.conn.outbound();
        if outbound.is_empty() {
            // The frames' buffer becomes the connection's; its emptied one goes back.
            std::mem::swap(outbound, &mut frames);
        } else {
            outbound.extend_from_slice(&frames);
        }
        self.dirty.push(token);
        frames
    }

    /// Marks a connection to flush (it became writable).
    pub fn touch(&mut self, token: Token) {
        if self.conns.contains_key(token.number()) {
            self.dirty.push(token);
        }
    }

    /// Writes what a connection has queued, best effort, and drops it.
    pub fn close(&mut self, token: Token) {
        self.stuck.remove(&token);
        if let Some(mut socket) = self.conns.remove(token.number()) {
            let _ = socket.conn.flush();
            self.closed.push((token, socket.conn));
        }
    }

    /// Flushes the connections touched since the last flush, noting which watched ones are
    /// stuck (`watched`: whether a connection counts); the ones that failed, dropped.
    pub fn flush(
        &mut self,
        now_us: u64,
        watched: impl Fn(Token) -> bool,
    ) -> Vec<(Token, ConnError)> {
        let mut dirty = std::mem::take(&mut self.dirty);
        dirty.sort_unstable();
        dirty.dedup();
        let mut failed = Vec::new();
        for &token in &dirty {
            let Some(socket) = self.conns.get_mut(token.number()) else {
                continue;
            };
            let before = socket.conn.outbound_len();
            let flushed = socket.conn.flush();
            let after = socket.conn.outbound_len();
            if after == 0 {
                if socket.write_stuck_since_us.take().is_some() {
                    self.stuck.remove(&token);
                }
            } else if after < before || socket.write_stuck_since_us.is_none() {
                socket.write_stuck_since_us = Some(now_us);
                if self.stuck_timeout_us.is_some() && watched(token) {
                    self.stuck.insert(token);
                }
            }
            if let Err(error) = flushed {
                failed.push((token, error));
            }
        }
        dirty.clear();
        self.dirty = dirty;
        for (token, _) in &failed {
            self.close(*token);
        }
        failed
    }

    /// Drops the watched connections stuck past the timeout: the ones dropped, and why.
    pub fn expire_stuck(&mut self, now_us: u64) -> Vec<(Token, ConnError)> {
        if self.stuck.is_empty() {
            return Vec::new();
        }
        let expired: Vec<Token> = (self.stuck.iter())
            .filter(|token| self.stuck_deadline(**token).is_some_and(|t| t <= now_us))
            .copied()
            .collect();
        let timeout_ms = self.stuck_timeout_us.unwrap_or(0) / 1000;
        let mut dropped = Vec::new();
        for token in expired {
            let queued = self
                .conns
                .get(token.number())
                .map_or(0, |s| s.conn.outbound_len());
            self.stuck.remove(&token);
            if let Some(socket) = self.conns.remove(token.number()) {
                self.closed.push((token, socket.conn));
            }
            let why = ConnError::Protocol(format!(
                "not reading: {queued} bytes queued for it and none written for {timeout_ms} ms"
            ));
            dropped.push((token, why));
        }
        dropped
    }

    /// When the next stuck connection counts as not reading.
    pub fn stuck_deadline_us(&self) -> Option<u64> {
        // Asked every loop round; a set that held some once keeps its buckets, and iterating
        // walks them all.
        if self.stuck.is_empty() {
            return None;
        }
        (self.stuck.iter())
            .filter_map(|token| self.stuck_deadline(*token))
            .min()
    }

    /// Flushes every connection once, best effort (the role is stopping).
    pub fn flush_all(&mut self) {
        for socket in self.conns.values_mut() {
            let _ = socket.conn.flush();
        }
    }

    /// When a stuck connection counts as not reading (strictly after the timeout).
    fn stuck_deadline(&self, token: Token) -> Option<u64> {
        let since = self.conns.get(token.number())?.write_stuck_since_us?;
        let timeout_us = self.stuck_timeout_us?;
        Some(since.saturating_add(timeout_us).saturating_add(1))
    }
}

/// A listener, its connections and their peer table; `S` is the role's state for each peer.
pub struct Server<S> {
    sockets: Sockets,
    peers: Peers<Token, S>,
    /// The table's clock starts here.
    epoch: Instant,
}

impl<S> std::fmt::Debug for Server<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("peers", &self.peers)
            .finish_non_exhaustive()
    }
}

impl<S> Server<S> {
    /// A server on `listener`; `name` says who refuses a newcomer to a full table.
    pub fn new(
        listener: TcpListener,
        inbound: Inbound,
        limits: Limits,
        name: &'static str,
    ) -> Self {
        let config = PeersConfig {
            inbound: inbound.clone(),
            name,
            limits,
        };
        Server {
            sockets: Sockets::new(listener, inbound, None),
            peers: Peers::new(config),
            epoch: Instant::now(),
        }
    }

    /// Watches the listener on the endpoint's loop.
    pub fn start<E: Endpoint>(&mut self, ctx: &mut Ctx<'_, E>) -> Result<(), String> {
        self.sockets.start(ctx)
    }

    /// Whether `token` is this server's (the listener or a peer).
    pub fn owns(&self, token: Token) -> bool {
        self.sockets.is_listener(token) || self.sockets.contains(token)
    }

    /// Peers held (in the handshake or past it).
    pub fn len(&self) -> usize {
        self.peers.len()
    }

    /// Whether it holds no peer.
    pub fn is_empty(&self) -> bool {
        self.peers.is_empty()
    }

    /// Handles a readiness event on one of its tokens: accepts on the listener, reads a peer.
    pub fn on_readiness<E: Endpoint>(
        &mut self,
        token: Token,
        event: &Event,
        handler: &mut impl Handler<S>,
        ctx: &mut Ctx<'_, E>,
    ) {
        if self.sockets.is_listener(token) {
            self.refresh_standings(handler);
            let now_us = self.now_us(Instant::now());
            self.sockets.accept(ctx, &mut self.peers, now_us);
        } else if event.is_readable() || event.is_read_closed() || event.is_error() {
            self.read(token, handler);
        } else {
            self.sockets.touch(token);
        }
        self.settle(handler);
        self.sockets.release(ctx);
    }

    /// A peer's outbound buffer, to append frames to (sent with the next [`Server::flush`]);
    /// `None` once it is closed.
    pub fn outbound(&mut self, peer: Token) -> Option<&mut BytesMut> {
        self.peers.outbound(peer)
    }

    /// Writes what the peers have queued; closes those whose socket failed or whose backlog is
    /// over the bound.
    pub fn flush(&mut self, handler: &mut impl Handler<S>) {
        self.settle(handler);
        let now_us = self.now_us(Instant::now());
        for (token, error) in self.sockets.flush(now_us, |_| false) {
            if let Some(state) = self.peers.remove(token) {
                handler.on_closed(token, state, &error);
            }
        }
    }

    /// Closes a peer (writing what it has queued, best effort).
    pub fn close(&mut self, token: Token, why: &ConnError, handler: &mut impl Handler<S>) {
        if let Some(out) = self.peers.outbound(token) {
            let bytes = std::mem::take(out);
            self.sockets.append(token, bytes);
        }
        let known = self.peers.contains(token);
        if let Some(state) = self.peers.remove(token) {
            handler.on_closed(token, state, why);
        } else if known && !matches!(why, ConnError::Closed) {
            tracing::info!("dropped a connection in its handshake: {why}");
        }
        self.sockets.close(token);
    }

    /// Closes the connections past their deadline: the handshake or the registration not done
    /// within the handshake timeout, a client silent for the idle timeout.
    pub fn expire(&mut self, now: Instant, handler: &mut impl Handler<S>) {
        self.refresh_standings(handler);
        self.peers.handle_timeout(self.now_us(now));
        self.settle(handler);
    }

    fn now_us(&self, now: Instant) -> u64 {
        us(now.saturating_duration_since(self.epoch))
    }

    /// Reads a peer until its socket would block, the table closes it or its handler fails.
    fn read(&mut self, token: Token, handler: &mut impl Handler<S>) {
        let now_us = self.now_us(Instant::now());
        let peers = &mut self.peers;
        let result = (self.sockets).read(token, ReadUntil::WouldBlock, |frame| {
            on_frame(peers, token, frame, now_us, handler)
        });
        if let Err(error) = result {
            if self.peers.contains(token) {
                self.close(token, &error, handler);
            }
        }
    }

    /// The table's outputs onto the connections: frames queued, closes carried out, the peers
    /// it closed itself told to the handler.
    fn settle(&mut self, handler: &mut impl Handler<S>) {
        while let Some((token, bytes)) = self.peers.poll_transmit() {
            let spare = self.sockets.append(token, bytes);
            self.peers.recycle(token, spare);
        }
        while let Some((token, state, why)) = self.peers.poll_gone() {
            handler.on_closed(token, state, &why);
        }
        while let Some((token, why)) = self.peers.poll_close() {
            tracing::debug!("closed a connection: {why}");
            self.sockets.close(token);
        }
    }

    /// Tells the table how each open peer counts now (the handler may have changed it).
    fn refresh_standings(&mut self, handler: &impl Handler<S>) {
        let tokens: Vec<Token> = self.peers.keys().collect();
        for token in tokens {
            let Some(state) = self.peers.state(token) else {
                continue;
            };
            let standing = handler.standing(token, state);
            if self.peers.standing(token) != Some(standing) {
                self.peers.set_standing(token, standing);
            }
        }
    }
}

impl<S> Admit for Peers<Token, S> {
    fn refusal(&mut self) -> Option<String> {
        Peers::refusal(self)
    }

    fn connected(&mut self, token: Token, nonce: [u8; 32], now_us: u64) -> Result<(), String> {
        self.handle_connected(token, nonce, now_us)
    }
}

/// Micros in a duration, saturating.
fn us(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

/// One frame from a peer: a step of its handshake, its opening, or the handler's.
fn on_frame<S>(
    peers: &mut Peers<Token, S>,
    token: Token,
    frame: Frame,
    now_us: u64,
    handler: &mut impl Handler<S>,
) -> Result<(), ConnError> {
    let Some(frame) = peers.unseal(token, &frame) else {
        return Err(ConnError::Protocol("a bad seal".into()));
    };
    match peers.handle_frame(token, &frame, now_us) {
        Arrival::Handshaking => Ok(()),
        Arrival::Open => {
            let Some((state, out)) = peers.open_mut(token) else {
                return Ok(());
            };
            let result = handler.on_frame(token, state, frame, out);
            if let Some(state) = peers.state(token) {
                let standing = handler.standing(token, state);
                if peers.standing(token) != Some(standing) {
                    peers.set_standing(token, standing);
                }
            }
            result
        }
        Arrival::Opened(role) => match handler.on_open(token, role) {
            Ok(state) => {
                let standing = handler.standing(token, &state);
                peers.open(token, state, standing);
                Ok(())
            }
            Err(reason) => {
                peers.refuse(token, reason.clone());
                Err(ConnError::Protocol(reason))
            }
        },
        Arrival::Failed | Arrival::Unknown => Err(ConnError::Protocol("closed".into())),
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::net::TcpStream;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use flint_engine::runtime::{Runtime, RuntimeConfig};

    use std::time::Duration;

    use super::*;
    use crate::conn::TABLE_FULL;
    use crate::standalone::BlockingClient;
    use crate::transport::encode;
    use crate::wire::{Kind, Message, FRAME_SIZE_MAX_DEFAULT};

    /// Peers past the handshake are status clients; each frame is acked.
    struct Clients;

    impl Handler<()> for Clients {
        fn on_open(&mut self, _peer: Token, _role: Role) -> Result<(), String> {
            Ok(())
        }

        fn on_frame(
            &mut self,
            _peer: Token,
            _state: &mut (),
            _frame: Frame,
            out: &mut BytesMut,
        ) -> Result<(), ConnError> {
            encode(&Message::HeartbeatAck {}, out, FRAME_SIZE_MAX_DEFAULT);
            Ok(())
        }

        fn on_closed(&mut self, _peer: Token, _state: (), _why: &ConnError) {}

        fn standing(&self, _peer: Token, _state: &()) -> Standing {
            Standing::Client
        }
    }

    struct Listening {
        server: Server<()>,
        /// The loop's registered sources, as of the last event.
        sources: Arc<AtomicUsize>,
    }

    impl Endpoint for Listening {
        type Msg = ();

        fn on_start(&mut self, ctx: &mut Ctx<'_, Self>) {
            self.server.start(ctx).expect("listens");
        }

        fn on_message(&mut self, _msg: (), _ctx: &mut Ctx<'_, Self>) {}

        fn on_readiness(&mut self, token: Token, event: &Event, ctx: &mut Ctx<'_, Self>) {
            self.server.on_readiness(token, event, &mut Clients, ctx);
            self.server.flush(&mut Clients);
            self.sources
                .store(ctx.sources_registered(), Ordering::SeqCst);
        }
    }

    /// A server with these limits on a runtime of its own, and its address.
    fn serve(handshakes_max: usize, clients_max: usize) -> (Runtime, std::net::SocketAddr) {
        let (runtime, addr, _) = serve_counting(handshakes_max, clients_max);
        (runtime, addr)
    }

    /// [`serve`], with the loop's registered sources as of its last event.
    fn serve_counting(
        handshakes_max: usize,
        clients_max: usize,
    ) -> (Runtime, std::net::SocketAddr, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
        let addr = listener.local_addr().expect("addr");
        let inbound = Inbound {
            role: Role::Master,
            accepted_roles: &[Role::Client],
            secret: None,
            frame_size_max: FRAME_SIZE_MAX_DEFAULT,
            outbound_max: 1 << 20,
        };
        let limits = Limits {
            connections_max: 16,
            handshakes_max,
            clients_max,
            handshake_timeout: Duration::from_secs(30),
            client_idle_timeout: Duration::from_secs(30),
            member_timeout: None,
        };
        let runtime = Runtime::new(RuntimeConfig {
            threads: 1,
            ..RuntimeConfig::default()
        })
        .expect("runtime");
        let server = Server::new(listener, inbound, limits, "the test");
        let sources = Arc::new(AtomicUsize::new(0));
        let listening = Listening {
            server,
            sources: sources.clone(),
        };
        runtime
            .handle()
            .spawn("listening", listening)
            .expect("spawns");
        (runtime, addr, sources)
    }

    #[test]
    fn closed_connections_leave_the_loop() {
        let (_runtime, addr, sources) = serve_counting(16, 16);
        for _ in 0..40 {
            let mut stream = TcpStream::connect(addr).expect("connect");
            // The server's Hello arrives, then the connection is dropped from this side.
            let mut byte = [0u8; 1];
            stream
                .set_read_timeout(Some(Duration::from_secs(30)))
                .expect("timeout");
            stream.read_exact(&mut byte).expect("the server's hello");
        }
        // One more connection wakes the loop after the last close was seen.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let probe = TcpStream::connect(addr).expect("connect");
            std::thread::sleep(Duration::from_millis(20));
            drop(probe);
            let registered = sources.load(Ordering::SeqCst);
            // The listener, the probe and at most a few closes not yet seen: never one per
            // connection ever accepted.
            if registered <= 4 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{registered} sources still registered after 40 connections closed"
            );
        }
    }

    /// The frames a raw connection receives until `last` arrives (or the peer closes).
    fn read_until(stream: &mut TcpStream, last: u16) -> Vec<Frame> {
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        let mut decoder = crate::wire::FrameDecoder::new(FRAME_SIZE_MAX_DEFAULT);
        let mut frames = Vec::new();
        loop {
            while let Some(frame) = decoder.next_frame().expect("well formed") {
                let done = frame.kind() == last;
                frames.push(frame);
                if done {
                    return frames;
                }
            }
            let mut buffer = [0u8; 4096];
            match stream.read(&mut buffer) {
                Ok(0) | Err(_) => return frames,
                Ok(read) => decoder.extend_from_slice(&buffer[..read]),
            }
        }
    }

    fn refusal(frames: &[Frame]) -> Option<String> {
        frames.iter().find_map(|f| match f.message() {
            Ok(Message::HandshakeRefused { reason }) => Some(reason.to_owned()),
            _ => None,
        })
    }

    #[test]
    fn the_oldest_handshake_goes_when_another_arrives_over_the_limit() {
        let (mut runtime, addr) = serve(2, 16);
        let mut streams: Vec<TcpStream> = Vec::new();
        for _ in 0..3 {
            let mut stream = TcpStream::connect(addr).expect("connects");
            // Its Hello says the server holds it.
            let hello = read_until(&mut stream, Kind::Hello as u16);
            assert_eq!(hello.last().map(Frame::kind), Some(Kind::Hello as u16));
            streams.push(stream);
        }
        let oldest = read_until(&mut streams[0], Kind::HandshakeRefused as u16);
        let reason = refusal(&oldest).expect("the oldest is told");
        assert!(reason.contains(TABLE_FULL), "{reason}");
        assert!(reason.contains("handshakes_max"), "{reason}");
        runtime.shutdown();
    }

    #[test]
    fn the_oldest_client_goes_when_another_finishes_its_handshake_over_the_limit() {
        let (mut runtime, addr) = serve(16, 1);
        let timeout = Duration::from_secs(30);
        let open = |client: &mut BlockingClient| {
            // An answer: the server holds it as a client.
            client.send(&Message::StatusRequest {}).expect("sends");
            let ack = client.next_frame().expect("an ack");
            assert_eq!(ack.kind(), Kind::HeartbeatAck as u16);
        };
        let mut first = BlockingClient::connect(addr, Role::Client, None, timeout).expect("first");
        open(&mut first);
        let mut second =
            BlockingClient::connect(addr, Role::Client, None, timeout).expect("second");
        open(&mut second);
        let frame = first.next_frame().expect("told before the close");
        let Ok(Message::HandshakeRefused { reason }) = frame.message() else {
            panic!("not a refusal: kind {}", frame.kind());
        };
        assert!(reason.contains("clients_max"), "{reason}");
        runtime.shutdown();
    }
}
