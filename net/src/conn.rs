//! One TCP connection on an event loop: a [`FrameDecoder`] for what arrives and a buffer of
//! encoded frames for what leaves, flushed with as few `write` calls as the socket allows.
//!
//! Sockets are registered edge-triggered for both readable and writable once; a readable event
//! means "read until `WouldBlock`", a writable event means "flush what is queued". Nothing here
//! knows what the frames mean: the roles do.

use std::io::{self, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::{Buf, BytesMut};
use flint_engine::runtime::{Ctx, Endpoint};
use mio::net::TcpStream;
use mio::{Interest, Token};

use crate::handshake::Secret;
use crate::wire::{Frame, FrameDecoder, Message, Role, WireError, READ_BUFFER_MIN};

/// Process-wide network counters, bumped by every connection.
#[derive(Debug, Default)]
pub struct NetCounters {
    /// Frames decoded from peers.
    pub frames_in: AtomicU64,
    /// Bytes read from peers.
    pub bytes_in: AtomicU64,
    /// Bytes written to peers.
    pub bytes_out: AtomicU64,
    /// Write calls that sent bytes (each carries one or more frames).
    pub writes: AtomicU64,
}

/// This process's network counters.
pub static NET: NetCounters = NetCounters {
    frames_in: AtomicU64::new(0),
    bytes_in: AtomicU64::new(0),
    bytes_out: AtomicU64::new(0),
    writes: AtomicU64::new(0),
};

impl NetCounters {
    /// Counts read bytes.
    #[inline]
    pub fn read(&self, bytes: usize) {
        self.bytes_in.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// Counts one decoded frame.
    #[inline]
    pub fn frame(&self) {
        self.frames_in.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one write.
    #[inline]
    pub fn wrote(&self, bytes: usize) {
        self.bytes_out.fetch_add(bytes as u64, Ordering::Relaxed);
        self.writes.fetch_add(1, Ordering::Relaxed);
    }
}

/// Why a connection ends.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    /// The peer closed its end.
    #[error("peer closed the connection")]
    Closed,
    /// The socket failed.
    #[error("socket error: {0}")]
    Io(#[from] io::Error),
    /// The peer sent malformed bytes.
    #[error("malformed input: {0}")]
    Wire(#[from] WireError),
    /// The peer broke the protocol in some other way.
    #[error("{0}")]
    Protocol(String),
    /// The peer does not read what we send.
    #[error("outbound buffer over {0} bytes: the peer is not reading")]
    Backlog(usize),
}

/// What a listening role tells a peer it has no room for (in `HandshakeRefused`); a peer that
/// reads it retries later with backoff.
pub const TABLE_FULL: &str = "connection table full";

/// A framed TCP connection.
#[derive(Debug)]
pub struct Connection {
    stream: TcpStream,
    peer: Option<SocketAddr>,
    decoder: FrameDecoder,
    frame_size_max: usize,
    outbound: BytesMut,
    outbound_max: usize,
}

impl Connection {
    /// Wraps a connected (or connecting) non-blocking stream.
    pub fn new(stream: TcpStream, frame_size_max: usize, outbound_max: usize) -> Self {
        let peer = stream.peer_addr().ok();
        // Small frames (a status batch, a heartbeat) must not wait for Nagle.
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!("set_nodelay failed: {error}");
        }
        Connection {
            stream,
            peer,
            decoder: FrameDecoder::new(frame_size_max),
            frame_size_max,
            outbound: BytesMut::new(),
            outbound_max,
        }
    }

    /// The socket, to register with a `mio::Registry`.
    pub fn stream_mut(&mut self) -> &mut TcpStream {
        &mut self.stream
    }

    /// The peer's address, when known.
    pub fn peer(&self) -> Option<SocketAddr> {
        self.peer.or_else(|| self.stream.peer_addr().ok())
    }

    /// Our address on this connection, when known.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.stream.local_addr().ok()
    }

    /// The buffer to append outgoing frames to; [`Connection::flush`] sends them.
    pub fn outbound(&mut self) -> &mut BytesMut {
        &mut self.outbound
    }

    /// Bytes queued and not yet written.
    pub fn outbound_len(&self) -> usize {
        self.outbound.len()
    }

    /// Reads what the socket has and hands every complete frame to `on_frame`, until the
    /// socket would block. Frames are handed over as they complete, so the buffer holds at most
    /// one frame and one read. Stops at the first error `on_frame` returns.
    pub fn read_frames(
        &mut self,
        on_frame: impl FnMut(&mut Self, Frame) -> Result<(), ConnError>,
    ) -> Result<(), ConnError> {
        self.read_frames_until(ReadUntil::WouldBlock, on_frame)
    }

    /// [`read_frames`](Self::read_frames), stopping where `until` says the socket is drained.
    pub fn read_frames_until(
        &mut self,
        until: ReadUntil,
        mut on_frame: impl FnMut(&mut Self, Frame) -> Result<(), ConnError>,
    ) -> Result<(), ConnError> {
        let mut drained = false;
        loop {
            while let Some(frame) = self.decoder.next_frame()? {
                NET.frame();
                on_frame(self, frame)?;
            }
            if drained {
                self.release_read_buffer();
                return Ok(());
            }
            match self.decoder.read_some(&mut self.stream) {
                Ok((0, _)) => return Err(ConnError::Closed),
                Ok((read, filled)) => {
                    NET.read(read);
                    drained = !filled && until == ReadUntil::Short;
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                    self.release_read_buffer();
                    return Ok(());
                }
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return Err(error.into()),
            }
        }
    }

    /// Drops the read buffer when it holds nothing and its allocation is larger than
    /// [`READ_BUFFER_MIN`] (a big frame's): an idle connection holds at most that much, and
    /// the small one it keeps takes the next frames without an allocation per read. Frames
    /// already handed out keep their part of the old buffer alive as long as they need it.
    fn release_read_buffer(&mut self) {
        if self.decoder.buffered_len() == 0 && self.decoder.allocated() > READ_BUFFER_MIN {
            self.decoder = FrameDecoder::new(self.frame_size_max);
        }
    }

    /// Bytes of read buffer allocation this connection holds (at most [`READ_BUFFER_MIN`]
    /// while idle).
    #[cfg(test)]
    pub fn read_buffer_allocated(&self) -> usize {
        self.decoder.allocated()
    }

    /// Writes queued frames until the queue is empty or the socket would block.
    pub fn flush(&mut self) -> Result<(), ConnError> {
        while !self.outbound.is_empty() {
            match self.stream.write(&self.outbound) {
                Ok(0) => return Err(ConnError::Closed),
                Ok(written) => {
                    NET.wrote(written);
                    self.outbound.advance(written);
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return Err(error.into()),
            }
        }
        if self.outbound.len() > self.outbound_max {
            return Err(ConnError::Backlog(self.outbound_max));
        }
        Ok(())
    }
}

/// How far [`Connection::read_frames_until`] reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadUntil {
    /// Until the socket would block (or the peer closed).
    WouldBlock,
    /// Until a read does not fill the room it was given: the socket was drained then, and
    /// under edge-triggered readiness (mio's) the next bytes or the peer's close come as a new
    /// event, so the read that would only hear "would block" (a system call per wake-up) is
    /// left out.
    Short,
}

impl ReadUntil {
    /// How far to read on readiness `event`: to "would block" when it says the peer closed
    /// or the socket failed (that close came with this event and no new one will tell it),
    /// else to a short read.
    pub fn of(event: &mio::event::Event) -> ReadUntil {
        if event.is_read_closed() || event.is_error() {
            ReadUntil::WouldBlock
        } else {
            ReadUntil::Short
        }
    }
}

/// The next connection waiting on `listener`, or `None` once it would block (an accept error
/// other than "would block" is logged and also ends this round).
pub fn accept_next(listener: &mio::net::TcpListener) -> Option<(TcpStream, SocketAddr)> {
    match listener.accept() {
        Ok(accepted) => Some(accepted),
        Err(error) if error.kind() == io::ErrorKind::WouldBlock => None,
        Err(error) => {
            tracing::warn!("accept failed: {error}");
            None
        }
    }
}

/// Tells a peer we accepted but have no room for why (a `HandshakeRefused` with `reason`, one
/// non-blocking write, best effort) and closes the connection.
pub fn refuse(mut stream: TcpStream, reason: &str) {
    let mut out = BytesMut::new();
    let refusal = Message::HandshakeRefused { reason };
    if refusal
        .encode(&mut out, crate::wire::FRAME_SIZE_MAX_DEFAULT)
        .is_ok()
    {
        let _ = stream.write(&out);
    }
    // Read what the peer sent (its `Hello`) before closing: closing with unread bytes sends a
    // reset, which may destroy the refusal before the peer reads it.
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let mut sink = [0u8; 512];
    while matches!(io::Read::read(&mut stream, &mut sink), Ok(n) if n > 0) {}
}

/// How a role opens a connection: one it accepted (driver, master, worker), or one it made
/// (the handshake is symmetric: [`crate::transport::client`] opens with it too).
#[derive(Debug, Clone)]
pub struct Inbound {
    /// Our role in the handshake.
    pub role: Role,
    /// The roles that may connect.
    pub accepted_roles: &'static [Role],
    /// The shared secret peers must prove they hold, if any.
    pub secret: Option<Secret>,
    /// Largest frame accepted or sent.
    pub frame_size_max: usize,
    /// Bytes a connection may have queued unsent before it is dropped.
    pub outbound_max: usize,
}

impl Inbound {
    /// Registers a stream (accepted, or connecting) on the endpoint's loop, for a role whose
    /// sans-IO side runs the handshake ([`crate::transport::peers`]).
    pub fn register<E: Endpoint>(
        &self,
        stream: TcpStream,
        ctx: &mut Ctx<'_, E>,
    ) -> Result<(Token, Connection), String> {
        let mut conn = Connection::new(stream, self.frame_size_max, self.outbound_max);
        let token = ctx
            .register(conn.stream_mut(), Interest::READABLE | Interest::WRITABLE)
            .map_err(|e| e.to_string())?;
        Ok((token, conn))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection over loopback (frames and backlog up to 1 MiB) and its peer's socket.
    fn connected() -> (std::net::TcpStream, Connection) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let peer =
            std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (accepted, _) = listener.accept().expect("accept");
        accepted.set_nonblocking(true).expect("nonblocking");
        let conn = Connection::new(TcpStream::from_std(accepted), 1 << 20, 1 << 20);
        (peer, conn)
    }

    /// Reads until one frame arrives (within a deadline); returns it.
    fn read_one(conn: &mut Connection) -> Frame {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let mut got = None;
        while got.is_none() {
            assert!(std::time::Instant::now() < deadline, "no frame arrived");
            conn.read_frames(|_, frame| {
                got = Some(frame);
                Ok(())
            })
            .expect("reads");
        }
        got.expect("a frame")
    }

    /// Reading to a short read delivers every frame, a big one over several reads too; the
    /// peer's close is heard by reading to "would block" (what a readiness event saying the
    /// peer closed asks for).
    #[test]
    fn reading_to_a_short_read_delivers_every_frame_and_would_block_hears_the_close() {
        let (mut peer, mut conn) = connected();
        let mut frames = BytesMut::new();
        Message::Shutdown {}
            .encode(&mut frames, 1 << 20)
            .expect("encodes");
        let reason = "x".repeat(200 * 1024);
        Message::RegisterExecutorFailed { reason: &reason }
            .encode(&mut frames, 1 << 20)
            .expect("encodes");
        peer.write_all(&frames).expect("write");
        drop(peer);
        let mut bodies = Vec::new();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while bodies.len() < 2 {
            assert!(
                std::time::Instant::now() < deadline,
                "frames lost: {bodies:?}"
            );
            conn.read_frames_until(ReadUntil::Short, |_, frame| {
                bodies.push(frame.body().len());
                Ok(())
            })
            .expect("no error before the close is read");
        }
        assert_eq!(bodies[0], 0);
        assert!(bodies[1] > 200 * 1024, "{bodies:?}");
        let closed = conn.read_frames_until(ReadUntil::WouldBlock, |_, _| Ok(()));
        assert!(matches!(closed, Err(ConnError::Closed)), "{closed:?}");
    }

    /// An idle connection holds at most a small read buffer, and that one takes the next small
    /// frames without a new allocation; a big frame's buffer is dropped once it is read.
    #[test]
    fn an_idle_connection_holds_at_most_a_small_read_buffer() {
        let (mut peer, mut conn) = connected();
        assert_eq!(conn.read_buffer_allocated(), 0, "allocated before any read");
        let mut small = BytesMut::new();
        Message::Shutdown {}
            .encode(&mut small, 1 << 20)
            .expect("encodes");
        peer.write_all(&small).expect("write");
        let first = read_one(&mut conn);
        assert_eq!(
            conn.read_buffer_allocated(),
            READ_BUFFER_MIN,
            "a small buffer kept"
        );
        // The next small frame lands in the same allocation, beside the first (still held).
        peer.write_all(&small).expect("write");
        let second = read_one(&mut conn);
        assert_eq!(conn.read_buffer_allocated(), READ_BUFFER_MIN);
        let (a, b) = (
            first.body().as_ptr() as usize,
            second.body().as_ptr() as usize,
        );
        assert!(
            b > a && b - a < READ_BUFFER_MIN,
            "one allocation: {a:#x} then {b:#x}"
        );
        // A frame bigger than the small buffer: its buffer goes once the connection is idle.
        let mut big = BytesMut::new();
        let reason = "x".repeat(64 * 1024);
        Message::RegisterExecutorFailed { reason: &reason }
            .encode(&mut big, 1 << 20)
            .expect("encodes");
        peer.write_all(&big).expect("write");
        let frame = read_one(&mut conn);
        assert!(frame.body().len() > READ_BUFFER_MIN);
        assert_eq!(
            conn.read_buffer_allocated(),
            0,
            "kept a big buffer while idle"
        );
    }
}
