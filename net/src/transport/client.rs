//! The client side of the transport, its IO half: a [`Link`] to one peer (the master) that
//! reconnects. The protocol is a [`LinkCore`] (the handshake, the bytes to send, the attempt's
//! deadline, the [`Backoff`] between attempts, the time the peer was last heard); the link
//! only connects (without blocking; the core's deadline bounds it), reads, writes and arms the
//! one timer the core asks for. The role drives it from its endpoint:
//! 1. [`Link::start`] once, then [`Link::on_timer`] and [`Link::read`] with every timer and
//!    readiness event (each says whether it was the link's);
//! 2. [`Link::read`] gives a [`Step`]: whether the handshake just finished (the hook to register,
//!    again after every reconnection: append the registration to [`Link::outbound`]), the
//!    frames that followed it, and why the connection ended, if it did;
//! 3. after handling the step the role calls [`Link::settle`] with the first error it met (or
//!    the step's end): the link flushes, or drops the connection and schedules the next attempt;
//! 4. the role calls [`Link::established`] once the peer accepted it (a registration answered):
//!    the backoff starts over, and losing the link from then on is logged as a loss.
//!
//! [`Silence`] is the rule for a peer behind a cut link, which sends no reset: no word for so
//! many heartbeat intervals and the role drops the link itself.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use flint_engine::runtime::{Ctx, Endpoint, TimerId};
use mio::event::Event;
use mio::net::TcpStream;
use mio::Token;

use super::link::{LinkCore, LinkEvent, LinkRules, Received};
use crate::conn::{ConnError, Connection, Inbound};
use crate::handshake::{random_nonce, Secret};
use crate::wire::{Frame, Role};

pub use super::link::{Backoff, Ended, Silence, BACKOFF_INITIAL};

/// How long one attempt to connect and finish the handshake may take by default.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// How a link connects.
#[derive(Debug, Clone)]
pub struct LinkConfig {
    /// The peer's address.
    pub addr: SocketAddr,
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
    /// Time one attempt has to connect, finish the handshake and be established.
    pub connect_timeout: Duration,
    /// Longest wait between two attempts.
    pub reconnect_max: Duration,
    /// Largest frame accepted or sent.
    pub frame_size_max: usize,
    /// Bytes the connection may have queued unsent before it is dropped.
    pub outbound_max: usize,
}

/// What one readiness event brought.
#[derive(Debug, Default)]
pub struct Step {
    /// The handshake just finished: register now.
    pub opened: bool,
    /// Frames after the handshake, in order.
    pub frames: Vec<Frame>,
    /// Why the connection ended, if it did (the frames before the end are still to handle).
    pub ended: Option<Ended>,
}

impl Step {
    /// The end to give [`Link::settle`] when handling the frames met no error.
    pub fn outcome(&self) -> Result<(), String> {
        match &self.ended {
            Some(ended) => Err(ended.why.clone()),
            None => Ok(()),
        }
    }
}

/// One connection attempt: its connection and poll token.
struct Dial {
    conn: Connection,
    token: Token,
    /// The TCP connect is still under way.
    connecting: bool,
}

/// A reconnecting link to one peer: the IO around a [`LinkCore`].
pub struct Link {
    config: LinkConfig,
    core: LinkCore,
    dial: Option<Dial>,
    /// The clock's origin: the core's `now_us` is the time since.
    epoch: Instant,
    /// The one timer and the `now_us` it is armed for (the core's `poll_timeout`).
    timer: Option<(TimerId, u64)>,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("addr", &self.config.addr)
            .field("core", &self.core)
            .finish_non_exhaustive()
    }
}

impl Link {
    /// A link, not connected yet ([`Link::start`]).
    pub fn new(config: LinkConfig) -> Link {
        let core = LinkCore::new(LinkRules {
            role: config.role,
            peer_roles: config.peer_roles,
            secret: config.secret.clone(),
            label: config.label.clone(),
            peer_name: config.peer_name,
            peer_addr: config.addr,
            connect_timeout_us: Some(micros(config.connect_timeout)),
            backoff: Some(Backoff::new(BACKOFF_INITIAL, config.reconnect_max)),
        });
        Link {
            config,
            core,
            dial: None,
            epoch: Instant::now(),
            timer: None,
        }
    }

    /// The first connection attempt.
    pub fn start<E: Endpoint>(&mut self, ctx: &mut Ctx<'_, E>) {
        self.drive(ctx);
    }

    /// Whether the handshake is done on the current connection.
    pub fn is_open(&self) -> bool {
        self.core.is_open()
    }

    /// Whether the peer accepted us on the current connection ([`Link::established`]).
    pub fn is_established(&self) -> bool {
        self.core.is_established()
    }

    /// The buffer to append frames to, while the handshake is done.
    pub fn outbound(&mut self) -> Option<&mut BytesMut> {
        self.core.outbound()
    }

    /// Our address on the current connection.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        let attempt = self.dial.as_ref()?;
        attempt.conn.local_addr()
    }

    /// How long the peer has said nothing on this connection.
    pub fn silent_for(&self, now: Instant) -> Duration {
        let now_us = micros(now.saturating_duration_since(self.epoch));
        Duration::from_micros(self.core.silent_for_us(now_us))
    }

    /// The peer accepted us: the backoff starts over, a loss from now on is logged as one.
    pub fn established(&mut self) {
        self.core.handle_established();
    }

    /// No attempt after the current connection ends (the role is over).
    pub fn stop_reconnecting(&mut self) {
        self.core.stop_reconnecting();
    }

    /// Handles a timer if it is the link's (the attempt's deadline, the next attempt).
    pub fn on_timer<E: Endpoint>(&mut self, timer: TimerId, ctx: &mut Ctx<'_, E>) -> bool {
        if self.timer.map(|(id, _)| id) != Some(timer) {
            return false;
        }
        self.timer = None;
        self.core.handle_timeout(self.now_us());
        self.drive(ctx);
        true
    }

    /// Reads a readiness event if it is the link's: the handshake, then the frames after it.
    pub fn read(&mut self, token: Token, event: &Event) -> Option<Step> {
        let now_us = self.now_us();
        let attempt = self.dial.as_mut().filter(|a| a.token == token)?;
        let mut step = Step::default();
        if attempt.connecting {
            if let Some(why) = connect_failure(attempt, event) {
                step.ended = Some(Ended {
                    why,
                    refused: false,
                });
                return Some(step);
            }
            if !event.is_writable() {
                return Some(step);
            }
            attempt.connecting = false;
        }
        if !(event.is_readable() || event.is_read_closed() || event.is_error()) {
            return Some(step);
        }
        let core = &mut self.core;
        let read = attempt
            .conn
            .read_frames(|_, frame| match receive(core, frame, now_us) {
                Ok((Received::Message, frame)) => {
                    step.frames.push(frame);
                    Ok(())
                }
                Ok((Received::Opened(_), _)) => {
                    step.opened = true;
                    Ok(())
                }
                Ok((Received::Handshake, _)) => Ok(()),
                Err(ended) => {
                    let why = ended.why.clone();
                    step.ended = Some(ended);
                    Err(ConnError::Protocol(why))
                }
            });
        if let (Err(error), None) = (read, &step.ended) {
            let why = match error {
                ConnError::Closed => format!("{} closed the connection", self.config.peer_name),
                other => other.to_string(),
            };
            step.ended = Some(Ended {
                why,
                refused: false,
            });
        }
        Some(step)
    }

    /// After a step: with an error, drops the connection (writing what is queued, best
    /// effort) and schedules the next attempt; otherwise flushes.
    pub fn settle<E: Endpoint>(&mut self, outcome: Result<(), String>, ctx: &mut Ctx<'_, E>) {
        match outcome {
            Err(why) => {
                let _ = self.write();
                self.drop_connection(&why, ctx);
            }
            Ok(()) => self.flush(ctx),
        }
    }

    /// Writes what is queued (nothing goes out before the connection is made).
    pub fn flush<E: Endpoint>(&mut self, ctx: &mut Ctx<'_, E>) {
        if let Err(error) = self.write() {
            self.drop_connection(&error.to_string(), ctx);
        }
    }

    /// Ends the connection for `why` and schedules the next attempt (the core logs it).
    pub fn drop_connection<E: Endpoint>(&mut self, why: &str, ctx: &mut Ctx<'_, E>) {
        if self.dial.is_none() {
            return;
        }
        self.deregister(ctx);
        self.core.handle_closed(why, self.now_us());
        self.drive(ctx);
    }

    /// The core's bytes onto the connection, and out.
    fn write(&mut self) -> Result<(), ConnError> {
        let Some(attempt) = self.dial.as_mut().filter(|a| !a.connecting) else {
            return Ok(());
        };
        self.core.poll_transmit(attempt.conn.outbound());
        attempt.conn.flush()
    }

    /// Does what the core asks (connect, drop), then arms the timer it wants.
    fn drive<E: Endpoint>(&mut self, ctx: &mut Ctx<'_, E>) {
        while let Some(event) = self.core.poll_event() {
            match event {
                LinkEvent::Connect => self.connect(ctx),
                LinkEvent::Drop(_) => self.deregister(ctx),
            }
        }
        let due_us = self.core.poll_timeout();
        if self.timer.map(|(_, at_us)| at_us) == due_us {
            return;
        }
        if let Some((old, _)) = self.timer.take() {
            ctx.cancel_timer(old);
        }
        if let Some(due_us) = due_us {
            let delay = Duration::from_micros(due_us.saturating_sub(self.now_us()));
            self.timer = ctx.timer_once(delay).ok().map(|id| (id, due_us));
        }
    }

    fn deregister<E: Endpoint>(&mut self, ctx: &mut Ctx<'_, E>) {
        if let Some(mut attempt) = self.dial.take() {
            let _ = ctx.deregister(attempt.conn.stream_mut(), attempt.token);
        }
    }

    fn connect<E: Endpoint>(&mut self, ctx: &mut Ctx<'_, E>) {
        let now_us = self.now_us();
        match self.open(ctx) {
            Ok((attempt, nonce)) => {
                self.dial = Some(attempt);
                self.core.handle_connected(nonce, now_us);
            }
            Err(why) => self.core.handle_closed(&why, now_us),
        }
    }

    fn open<E: Endpoint>(&self, ctx: &mut Ctx<'_, E>) -> Result<(Dial, [u8; 32]), String> {
        let config = &self.config;
        let nonce = random_nonce().map_err(|e| format!("no random nonce: {e}"))?;
        let stream = TcpStream::connect(config.addr).map_err(|e| format!("connect failed: {e}"))?;
        let opener = Inbound {
            role: config.role,
            accepted_roles: config.peer_roles,
            secret: config.secret.clone(),
            frame_size_max: config.frame_size_max,
            outbound_max: config.outbound_max,
        };
        let (token, conn) = opener.register(stream, ctx)?;
        let attempt = Dial {
            conn,
            token,
            connecting: true,
        };
        Ok((attempt, nonce))
    }

    fn now_us(&self) -> u64 {
        micros(self.epoch.elapsed())
    }
}

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

/// Why a connection still connecting failed, if the event says it did.
fn connect_failure(attempt: &mut Dial, event: &Event) -> Option<String> {
    if event.is_error() || event.is_read_closed() || event.is_write_closed() {
        return Some("connection refused or failed".into());
    }
    if event.is_writable() {
        if let Err(error) = attempt.conn.stream_mut().peer_addr() {
            return Some(format!("connect failed: {error}"));
        }
    }
    None
}

/// A frame from the peer through the core: opened if the connection is sealed, then handled.
fn receive(core: &mut LinkCore, frame: Frame, now_us: u64) -> Result<(Received, Frame), Ended> {
    let frame = core.unseal(frame)?;
    Ok((core.handle_frame(&frame, now_us)?, frame))
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use flint_engine::runtime::{Runtime, RuntimeConfig};

    use super::*;
    use crate::handshake::Handshake;
    use crate::transport::encode;
    use crate::wire::{FrameDecoder, Kind, Message, FRAME_SIZE_MAX_DEFAULT};

    /// A role that registers (a `RegisterWorker`) each time its link opens.
    struct Registering {
        link: Link,
    }

    impl Endpoint for Registering {
        type Msg = ();

        fn on_start(&mut self, ctx: &mut Ctx<'_, Self>) {
            self.link.start(ctx);
        }

        fn on_message(&mut self, _msg: (), _ctx: &mut Ctx<'_, Self>) {}

        fn on_readiness(&mut self, token: Token, event: &Event, ctx: &mut Ctx<'_, Self>) {
            let Some(step) = self.link.read(token, event) else {
                return;
            };
            if step.opened {
                let register = Message::RegisterWorker {
                    worker_id: "w1",
                    host: "h",
                    port: 0,
                    cores: 1,
                    memory_mb: 1,
                };
                if let Some(out) = self.link.outbound() {
                    encode(&register, out, FRAME_SIZE_MAX_DEFAULT);
                }
                self.link.established();
            }
            self.link.settle(step.outcome(), ctx);
        }

        fn on_timer(&mut self, timer: TimerId, ctx: &mut Ctx<'_, Self>) {
            self.link.on_timer(timer, ctx);
        }
    }

    /// Plays the master for one connection: accepts, handshakes, returns the first frame after
    /// the handshake, and hangs up.
    fn serve_once(listener: &std::net::TcpListener) -> Frame {
        let mut stream = accept_within(listener, Duration::from_secs(30));
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        let mut out = BytesMut::new();
        let nonce = crate::handshake::random_nonce().expect("nonce");
        let mut handshake = Handshake::accept(Role::Master, None, nonce, &[Role::Worker], &mut out);
        stream.write_all(&out).expect("hello");
        let mut decoder = FrameDecoder::new(FRAME_SIZE_MAX_DEFAULT);
        let mut open = false;
        loop {
            while let Some(frame) = decoder.next_frame().expect("well formed") {
                if open {
                    return frame;
                }
                let mut out = BytesMut::new();
                let step = handshake.on_frame(frame.kind(), frame.body(), &mut out);
                stream.write_all(&out).expect("writes");
                open = step.expect("the handshake succeeds").is_some();
            }
            let mut buffer = [0u8; 4096];
            let read = stream
                .read(&mut buffer)
                .expect("the link sends within 30 s");
            assert!(read > 0, "the link hung up first");
            decoder.extend_from_slice(&buffer[..read]);
        }
    }

    /// The next connection on a non-blocking listener, waiting at most `timeout`.
    fn accept_within(listener: &std::net::TcpListener, timeout: Duration) -> std::net::TcpStream {
        let deadline = Instant::now() + timeout;
        loop {
            match listener.accept() {
                Ok((stream, _)) => {
                    stream.set_nonblocking(false).expect("blocking");
                    return stream;
                }
                Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {
                    assert!(
                        Instant::now() < deadline,
                        "no connection within {timeout:?}"
                    );
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(error) => panic!("accept failed: {error}"),
            }
        }
    }

    #[test]
    fn the_link_registers_again_after_every_reconnection() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("non-blocking");
        let link = Link::new(LinkConfig {
            addr: listener.local_addr().expect("addr"),
            role: Role::Worker,
            peer_roles: &[Role::Master],
            secret: None,
            label: "test".into(),
            peer_name: "the master",
            connect_timeout: CONNECT_TIMEOUT,
            reconnect_max: Duration::from_millis(100),
            frame_size_max: FRAME_SIZE_MAX_DEFAULT,
            outbound_max: 1 << 20,
        });
        let mut runtime = Runtime::new(RuntimeConfig {
            threads: 1,
            ..RuntimeConfig::default()
        })
        .expect("runtime");
        runtime
            .handle()
            .spawn("registering", Registering { link })
            .expect("spawns");
        for connection in 0..3 {
            let first = serve_once(&listener);
            assert_eq!(
                first.kind(),
                Kind::RegisterWorker as u16,
                "connection {connection} did not start with the registration"
            );
        }
        runtime.shutdown();
    }
}
