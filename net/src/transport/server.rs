//! The server side of the transport: a listener and its peer table, for any listening role.
//!
//! Contract. A role builds a [`Server`] with an `Inbound` (its role, the roles it accepts, the
//! secret, frame and buffer bounds) and [`Limits`], and implements [`Handler`] for what the
//! frames mean. The server owns everything about connections:
//! - accepting until the listener would block, and the handshake ([`crate::handshake`]) on each
//!   new connection; when it completes, [`Handler::on_open`] gives the peer its state `S` (or a
//!   reason to refuse it, sent as `HandshakeRefused`);
//! - limits per kind: connections still in the handshake at most `handshakes_max`, peers whose
//!   [`Handler::standing`] is [`Standing::Client`] at most `clients_max`, all at most
//!   `connections_max`. The oldest of a kind goes when another arrives, told
//!   `HandshakeRefused{connection table full}` (`Connection::evict_for_full_table`); a full
//!   table with no handshake or client to evict refuses the newcomer;
//! - deadlines: the handshake and a [`Standing::Registering`] peer's registration within
//!   `handshake_timeout` of the accept, a client silent `client_idle_timeout` is closed
//!   ([`Server::expire`], on the role's tick);
//! - reading: frames after the handshake go to [`Handler::on_frame`] as they complete, until
//!   the socket would block or the handler returns an error (which closes the peer);
//! - writing: the role appends to [`Server::outbound`], which marks the peer dirty, and calls
//!   [`Server::flush`] once per event; a peer whose flush fails is closed;
//! - closing: [`Server::close`] (or any failure above) flushes what is queued, best effort, and
//!   tells the handler ([`Handler::on_closed`]) for peers past the handshake.
//!
//! Nothing here knows a role's messages: the master, the worker's status listener and (next)
//! the driver share it. Peers are named by their `mio` [`Token`].

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use flint_engine::runtime::{Ctx, Endpoint};
use mio::event::Event;
use mio::net::TcpListener;
use mio::{Interest, Token};

use crate::conn::{accept_next, refuse, ConnError, Connection, Inbound, TABLE_FULL};
use crate::handshake::Handshake;
use crate::transport::encode;
use crate::wire::{Frame, Message, Role};

/// How a peer past the handshake counts against the limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Must register within the handshake timeout (counted from the accept).
    Registering,
    /// A short-lived client (`flint status`): at most `clients_max`, the oldest evicted, closed
    /// when silent for the idle timeout, evictable when the table is full.
    Client,
    /// A registered peer (a worker, an application, an executor): never evicted or expired here.
    Member,
}

/// The bounds of a server's peer table.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Connections held at once.
    pub connections_max: usize,
    /// Connections still in the handshake held at once (the oldest goes).
    pub handshakes_max: usize,
    /// [`Standing::Client`] peers held at once (the oldest goes).
    pub clients_max: usize,
    /// Time from the accept to the end of the handshake and the registration.
    pub handshake_timeout: Duration,
    /// A client silent this long is closed.
    pub client_idle_timeout: Duration,
}

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

enum Phase<S> {
    Handshake(Box<Handshake>),
    Open(S),
}

struct Peer<S> {
    conn: Connection,
    phase: Phase<S>,
    opened: Instant,
    last_heard: Instant,
    /// On the dirty list (once, however often it is touched before the flush).
    dirty: bool,
}

/// A listener and its peer table; `S` is the role's state for each peer.
pub struct Server<S> {
    listener: TcpListener,
    listener_token: Option<Token>,
    inbound: Inbound,
    limits: Limits,
    /// Who refuses a newcomer to a full table ("the master").
    name: &'static str,
    peers: HashMap<Token, Peer<S>>,
    dirty: Vec<Token>,
}

impl<S> std::fmt::Debug for Server<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("name", &self.name)
            .field("peers", &self.peers.len())
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
        Server {
            listener,
            listener_token: None,
            inbound,
            limits,
            name,
            peers: HashMap::new(),
            dirty: Vec::new(),
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

    /// Whether `token` is this server's (the listener or a peer).
    pub fn owns(&self, token: Token) -> bool {
        Some(token) == self.listener_token || self.peers.contains_key(&token)
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
        if Some(token) == self.listener_token {
            self.accept(handler, ctx);
        } else {
            let readable = event.is_readable() || event.is_read_closed() || event.is_error();
            self.on_peer_event(token, readable, handler);
        }
    }

    /// A peer's outbound buffer, to append frames to (marks it for the next [`Server::flush`]);
    /// `None` once it is closed.
    pub fn outbound(&mut self, peer: Token) -> Option<&mut BytesMut> {
        self.mark_dirty(peer);
        let found = self.peers.get_mut(&peer)?;
        Some(found.conn.outbound())
    }

    fn mark_dirty(&mut self, token: Token) {
        if let Some(peer) = self.peers.get_mut(&token) {
            if !peer.dirty {
                peer.dirty = true;
                self.dirty.push(token);
            }
        }
    }

    /// Writes what the peers touched since the last flush have queued; closes those whose
    /// socket failed or whose backlog is over the bound.
    pub fn flush(&mut self, handler: &mut impl Handler<S>) {
        let mut failed = Vec::new();
        for token in std::mem::take(&mut self.dirty) {
            if let Some(peer) = self.peers.get_mut(&token) {
                peer.dirty = false;
                if let Err(error) = peer.conn.flush() {
                    failed.push((token, error));
                }
            }
        }
        for (token, error) in failed {
            self.close(token, &error, handler);
        }
    }

    /// Closes a peer (writing what it has queued, best effort).
    pub fn close(&mut self, token: Token, why: &ConnError, handler: &mut impl Handler<S>) {
        let Some(mut peer) = self.peers.remove(&token) else {
            return;
        };
        let _ = peer.conn.flush();
        match peer.phase {
            Phase::Open(state) => handler.on_closed(token, state, why),
            Phase::Handshake(_) => {
                if !matches!(why, ConnError::Closed) {
                    tracing::info!(peer = ?peer.conn.peer(), "dropped a connection: {why}");
                }
            }
        }
    }

    /// Closes the connections past their deadline: the handshake or the registration not done
    /// within the handshake timeout, a client silent for the idle timeout.
    pub fn expire(&mut self, now: Instant, handler: &mut impl Handler<S>) {
        let timeout = self.limits.handshake_timeout;
        let idle = self.limits.client_idle_timeout;
        let expired: Vec<(Token, String)> = self
            .peers
            .iter()
            .filter_map(|(token, p)| {
                let standing = match &p.phase {
                    Phase::Handshake(_) => Standing::Registering,
                    Phase::Open(state) => handler.standing(*token, state),
                };
                match standing {
                    Standing::Registering if now.duration_since(p.opened) > timeout => Some((
                        *token,
                        format!(
                            "no handshake and registration within {} ms",
                            timeout.as_millis()
                        ),
                    )),
                    Standing::Client if now.duration_since(p.last_heard) > idle => Some((
                        *token,
                        format!("a status connection silent for {} ms", idle.as_millis()),
                    )),
                    _ => None,
                }
            })
            .collect();
        for (token, why) in expired {
            self.close(token, &ConnError::Protocol(why), handler);
        }
    }

    fn accept<E: Endpoint>(&mut self, handler: &mut impl Handler<S>, ctx: &mut Ctx<'_, E>) {
        while let Some((stream, addr)) = accept_next(&self.listener) {
            // Unauthenticated connections have a table of their own: the oldest goes.
            if self.count(handler, Kind::Handshake) >= self.limits.handshakes_max {
                self.evict_oldest(handler, Kind::Handshake, "handshakes_max");
            }
            if self.peers.len() >= self.limits.connections_max
                && !self.evict_oldest(handler, Kind::Evictable, "connections_max")
            {
                tracing::warn!(%addr, "refused a connection: {TABLE_FULL}");
                let reason = format!(
                    "{TABLE_FULL}: {} holds {} connections",
                    self.name,
                    self.peers.len()
                );
                refuse(stream, &reason);
                continue;
            }
            match self.inbound.open(stream, ctx) {
                Ok((token, conn, handshake)) => {
                    let now = Instant::now();
                    let phase = Phase::Handshake(Box::new(handshake));
                    let peer = Peer {
                        conn,
                        phase,
                        opened: now,
                        last_heard: now,
                        dirty: false,
                    };
                    self.peers.insert(token, peer);
                    self.mark_dirty(token);
                }
                Err(error) => tracing::warn!(%addr, "could not set up a connection: {error}"),
            }
        }
    }

    fn on_peer_event(&mut self, token: Token, readable: bool, handler: &mut impl Handler<S>) {
        let Some(mut peer) = self.peers.remove(&token) else {
            return;
        };
        let mut result = Ok(());
        let frame_size_max = self.inbound.frame_size_max;
        if readable {
            peer.last_heard = Instant::now();
            let phase = &mut peer.phase;
            let mut opened_client = false;
            result = peer.conn.read_frames(|conn, frame| match phase {
                Phase::Open(state) => handler.on_frame(token, state, frame, conn.outbound()),
                Phase::Handshake(handshake) => {
                    let Some(role) = handshake_step(handshake, frame, conn)? else {
                        return Ok(());
                    };
                    match handler.on_open(token, role) {
                        Ok(state) => {
                            opened_client = handler.standing(token, &state) == Standing::Client;
                            *phase = Phase::Open(state);
                            Ok(())
                        }
                        Err(reason) => {
                            let refusal = Message::HandshakeRefused { reason: &reason };
                            encode(&refusal, conn.outbound(), frame_size_max);
                            Err(ConnError::Protocol(reason))
                        }
                    }
                }
            });
            // Clients have a table of their own: the oldest goes.
            if opened_client && self.count(handler, Kind::Client) >= self.limits.clients_max {
                self.evict_oldest(handler, Kind::Client, "clients_max");
            }
        }
        self.peers.insert(token, peer);
        match result {
            Ok(()) => self.mark_dirty(token),
            Err(error) => self.close(token, &error, handler),
        }
    }

    /// Peers of a kind.
    fn count(&self, handler: &impl Handler<S>, kind: Kind) -> usize {
        self.peers
            .iter()
            .filter(|(token, p)| kind.matches(**token, &p.phase, handler))
            .count()
    }

    /// Closes the oldest peer of a kind (telling it the table is full); whether there was one.
    fn evict_oldest(&mut self, handler: &mut impl Handler<S>, kind: Kind, limit: &str) -> bool {
        let oldest = self
            .peers
            .iter()
            .filter(|(token, p)| kind.matches(**token, &p.phase, handler))
            .min_by_key(|(_, p)| p.opened)
            .map(|(token, _)| *token);
        let Some(token) = oldest else {
            return false;
        };
        if let Some(mut peer) = self.peers.remove(&token) {
            peer.conn.evict_for_full_table(Some(limit));
            if let Phase::Open(state) = peer.phase {
                let why = ConnError::Protocol(format!("{TABLE_FULL} ({limit})"));
                handler.on_closed(token, state, &why);
            }
        }
        true
    }
}

/// One handshake frame: the peer's role once the handshake is done.
fn handshake_step(
    handshake: &mut Handshake,
    frame: Frame,
    conn: &mut Connection,
) -> Result<Option<Role>, ConnError> {
    handshake
        .on_frame(frame.kind(), frame.body(), conn.outbound())
        .map_err(|error| ConnError::Protocol(format!("handshake failed: {error}")))
}

/// The kinds of peers the limits count.
#[derive(Clone, Copy)]
enum Kind {
    Handshake,
    Client,
    /// What a full table may evict: a handshake or a client.
    Evictable,
}

impl Kind {
    fn matches<S>(self, token: Token, phase: &Phase<S>, handler: &impl Handler<S>) -> bool {
        let client = |state: &S| handler.standing(token, state) == Standing::Client;
        match (self, phase) {
            (Kind::Handshake | Kind::Evictable, Phase::Handshake(_)) => true,
            (Kind::Client | Kind::Evictable, Phase::Open(state)) => client(state),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::net::TcpStream;

    use flint_engine::runtime::{Runtime, RuntimeConfig};

    use super::*;
    use crate::standalone::BlockingClient;
    use crate::wire::{Kind, FRAME_SIZE_MAX_DEFAULT};

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
        }
    }

    /// A server with these limits on a runtime of its own, and its address.
    fn serve(handshakes_max: usize, clients_max: usize) -> (Runtime, std::net::SocketAddr) {
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
        };
        let runtime = Runtime::new(RuntimeConfig {
            threads: 1,
            ..RuntimeConfig::default()
        })
        .expect("runtime");
        let server = Server::new(listener, inbound, limits, "the test");
        runtime
            .handle()
            .spawn("listening", Listening { server })
            .expect("spawns");
        (runtime, addr)
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
