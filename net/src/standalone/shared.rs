//! Pieces the standalone roles share: conversions between the wire's messages and the engine's
//! standalone types, and a blocking request/answer client for people's commands (`flint status`).

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use flint_engine::standalone as sa;

use crate::handshake::{random_nonce, Handshake, HandshakeError, Secret};
use crate::seal::Seal;
use crate::wire::{
    self, AppDescription, Frame, FrameDecoder, KeyValue, List, Message, Role,
    FRAME_SIZE_MAX_DEFAULT,
};

/// The message a worker puts in `ExecutorStateChanged(Running)` for an executor that kept
/// running while it was away from the master (after it registered again): the master adopts
/// the executor instead of counting it as new.
pub const REATTACH_MESSAGE: &str = "still running after the worker registered again";

/// At most the first 64 bytes of `text` (whole characters), for messages about a peer's input.
pub fn clip_for_log(text: &str) -> &str {
    let mut end = text.len().min(64);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.get(..end).unwrap_or_default()
}

/// An application description from the wire, owned.
pub fn spec_from_wire(app: &AppDescription<'_>) -> sa::AppSpec {
    sa::AppSpec {
        name: app.name.to_owned(),
        driver_addr: app.driver_addr.to_owned(),
        command: app.command.to_owned(),
        args: app.args.iter().map(str::to_owned).collect(),
        env: app
            .env
            .iter()
            .map(|kv| (kv.key.to_owned(), kv.value.to_owned()))
            .collect(),
        cores_per_executor: app.cores_per_executor,
        max_cores: app.max_cores,
        memory_mb: app.memory_mb,
    }
}

/// Calls `f` with `spec` as a wire description (which borrows from it).
pub fn with_description<R>(spec: &sa::AppSpec, f: impl FnOnce(AppDescription<'_>) -> R) -> R {
    let args: Vec<&str> = spec.args.iter().map(String::as_str).collect();
    let env: Vec<KeyValue<'_>> = spec
        .env
        .iter()
        .map(|(key, value)| KeyValue { key, value })
        .collect();
    f(AppDescription {
        name: &spec.name,
        driver_addr: &spec.driver_addr,
        command: &spec.command,
        args: List::from_items(&args),
        env: List::from_items(&env),
        cores_per_executor: spec.cores_per_executor,
        max_cores: spec.max_cores,
        memory_mb: spec.memory_mb,
    })
}

/// Why a status request (`flint status`, [`crate::observe::cluster_view`]) failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The TCP connection could not be made.
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        /// The address.
        addr: SocketAddr,
        /// What the operating system said.
        source: std::io::Error,
    },
    /// The handshake's nonce could not be drawn.
    #[error("no random nonce: {0}")]
    Nonce(std::io::Error),
    /// The peer refused the handshake, or broke it.
    #[error("handshake with {addr} failed: {source}")]
    Handshake {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: HandshakeError,
    },
    /// A message could not be encoded, or the peer's bytes are not frames.
    #[error("{0}")]
    Wire(#[from] wire::WireError),
    /// The peer's answer is a frame but not a message.
    #[error("malformed answer: {0}")]
    Malformed(wire::WireError),
    /// The peer answered with another message than the one asked for.
    #[error("unexpected answer {0}")]
    Unexpected(&'static str),
    /// Nothing arrived before the deadline.
    #[error("timed out waiting for an answer")]
    TimedOut,
    /// The peer closed the connection.
    #[error("the peer closed the connection")]
    Closed,
    /// Reading failed (setting the read timeout included).
    #[error("read failed: {0}")]
    Read(std::io::Error),
    /// Writing failed.
    #[error("write failed: {0}")]
    Write(std::io::Error),
}

/// A blocking connection for one-shot requests (`flint status`): handshake, then messages.
pub struct BlockingClient {
    stream: TcpStream,
    decoder: FrameDecoder,
    deadline: Instant,
    /// The connection's seal (toward a master or a worker, with a secret).
    seal: Option<Seal>,
}

impl BlockingClient {
    /// Connects to `addr` as `role` and completes the handshake; everything must happen within
    /// `timeout`.
    pub fn connect(
        addr: SocketAddr,
        role: Role,
        secret: Option<Secret>,
        timeout: Duration,
    ) -> Result<BlockingClient, ClientError> {
        let deadline = Instant::now() + timeout;
        let stream = TcpStream::connect_timeout(&addr, timeout)
            .map_err(|source| ClientError::Connect { addr, source })?;
        let _ = stream.set_nodelay(true);
        let mut client = BlockingClient {
            stream,
            decoder: FrameDecoder::new(FRAME_SIZE_MAX_DEFAULT),
            deadline,
            seal: None,
        };
        let nonce = random_nonce().map_err(ClientError::Nonce)?;
        let mut out = BytesMut::new();
        let mut handshake =
            Handshake::connect(role, secret, nonce, &[Role::Master, Role::Worker], &mut out);
        client.write(&out)?;
        loop {
            let frame = client.next_frame()?;
            let mut out = BytesMut::new();
            let step = handshake.on_frame(frame.kind(), frame.body(), &mut out);
            client.write(&out)?;
            match step {
                Ok(Some(_)) => {
                    client.seal = handshake.take_seal();
                    return Ok(client);
                }
                Ok(None) => {}
                Err(source) => return Err(ClientError::Handshake { addr, source }),
            }
        }
    }

    /// Sends one message.
    pub fn send(&mut self, message: &Message<'_>) -> Result<(), ClientError> {
        let mut out = BytesMut::new();
        message.encode(&mut out, FRAME_SIZE_MAX_DEFAULT)?;
        if let Some(seal) = self.seal.as_mut() {
            let plain = out.split();
            seal.seal(&plain, &mut out);
        }
        self.write(&out)
    }

    /// The next frame (decode it with [`Frame::message`]).
    pub fn next_frame(&mut self) -> Result<Frame, ClientError> {
        loop {
            if let Some(frame) = self.decoder.next_frame()? {
                return match self.seal.as_mut() {
                    Some(seal) => Ok(seal.open(&frame)?),
                    None => Ok(frame),
                };
            }
            let remaining = self.deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(ClientError::TimedOut);
            }
            self.stream
                .set_read_timeout(Some(remaining))
                .map_err(ClientError::Read)?;
            match self.decoder.read_from(&mut self.stream) {
                Ok(0) => return Err(ClientError::Closed),
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(ClientError::Read(e)),
            }
        }
    }

    fn write(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        self.stream.write_all(bytes).map_err(ClientError::Write)
    }
}
