//! The connection handshake as a sans-IO state machine. Both sides send `Hello` at once; with a
//! shared secret each then proves it holds the secret with an HMAC-SHA256 over the whole
//! transcript (both roles, both nonces) and its side of the connection, the connector first:
//!
//! ```text
//! connector                                  acceptor
//!   Hello{role_c, auth, nonce_c}  ------->
//!                               <-------     Hello{role_a, auth, nonce_a}
//!   (with a secret; T = role_c || role_a || nonce_c || nonce_a)
//!   AuthProof{HMAC(k, "connector" || T)} -->
//!                                            checks it, then
//!                               <-------     AuthProof{HMAC(k, "acceptor" || T)}
//!   checks it
//! ```
//!
//! Why this shape. A proof names both nonces, so it is good for one connection only (no
//! replay), and its side, so a connector's proof cannot be reflected back as an acceptor's. The
//! acceptor proves itself only to a connector that has proved itself, so a process without the
//! secret that makes a victim connect to it cannot get the real acceptor's proof over the
//! victim's nonce by connecting there itself (the relay of issue 25: on protocol version 2 the
//! real master signed whatever nonce it was given before it checked anything). The connector
//! proves itself first, but its proof names the acceptor's nonce, which only the acceptor it is
//! talking to chose. A relay that forwards every byte both ways is left, and the connection's
//! frames are sealed against it (see [`crate::seal`]): it passes the handshake but can neither
//! read keys nor inject, drop or reorder a frame unnoticed.
//!
//! A side whose authentication method differs from the peer's, or whose proof is wrong, sends
//! `HandshakeRefused{reason}` and closes; so does a side that receives a `Hello` of another
//! protocol version (an old peer), naming both versions.

use std::io::{Read, Write};
use std::path::Path;
use std::sync::{Mutex, OnceLock};

use bytes::BytesMut;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::seal::Seal;
use crate::wire::{AuthMethod, Message, Role, WireError};

/// The environment variable that carries the shared secret.
pub const SECRET_ENV: &str = "FLINT_SECRET";

/// The largest secret file read, in bytes.
pub const SECRET_FILE_BYTES_MAX: u64 = 4096;

/// Why a [`Secret`] could not be made, read or written.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// The secret has no bytes.
    #[error("the shared secret is empty")]
    Empty,
    /// The secret file could not be read.
    #[error("cannot read secret file {}: {source}", path.display())]
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// What the operating system said.
        source: std::io::Error,
    },
    /// The secret file could not be created (it may exist already).
    #[error("cannot create secret file {}: {source}", path.display())]
    Create {
        /// The file.
        path: std::path::PathBuf,
        /// What the operating system said.
        source: std::io::Error,
    },
    /// The secret file was created but writing it failed.
    #[error("cannot write secret file {}: {source}", path.display())]
    Write {
        /// The file.
        path: std::path::PathBuf,
        /// What the operating system said.
        source: std::io::Error,
    },
}

/// A shared secret for the handshake.
#[derive(Clone)]
pub struct Secret(Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    /// A secret from bytes; an empty one is refused.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<Secret, SecretError> {
        let bytes = bytes.into();
        if bytes.is_empty() {
            return Err(SecretError::Empty);
        }
        Ok(Secret(bytes))
    }

    /// Reads a secret from a file (a trailing newline is dropped): a regular file of at most
    /// [`SECRET_FILE_BYTES_MAX`] bytes (not a FIFO, a device or a directory). A file other
    /// users may read or write is used, with a warning.
    pub fn from_file(path: &Path) -> Result<Secret, SecretError> {
        use std::os::unix::fs::PermissionsExt;
        let (text, meta) =
            crate::files::read_small(path, SECRET_FILE_BYTES_MAX).map_err(|source| {
                SecretError::Read {
                    path: path.to_owned(),
                    source,
                }
            })?;
        if meta.permissions().mode() & 0o077 != 0 {
            tracing::warn!(
                "secret file {} is open to other users (mode {:o}); chmod 600 it",
                path.display(),
                meta.permissions().mode() & 0o777
            );
        }
        let trimmed = text.strip_suffix(b"\n").unwrap_or(&text);
        Secret::new(trimmed.to_vec())
    }

    /// The secret in an environment variable, if it is set.
    pub fn from_env(name: &str) -> Result<Option<Secret>, SecretError> {
        match std::env::var_os(name) {
            None => Ok(None),
            Some(value) => Secret::new(value.into_encoded_bytes()).map(Some),
        }
    }

    /// A fresh random secret: 32 random bytes as 64 hex digits (printable, so it can live in a
    /// file or an environment variable).
    pub fn generate() -> std::io::Result<Secret> {
        let bytes = random_nonce()?;
        let hex: Vec<u8> = bytes
            .iter()
            .flat_map(|b| [b >> 4, b & 15])
            .map(|d| b"0123456789abcdef"[usize::from(d)])
            .collect();
        Ok(Secret(hex))
    }

    /// The secret's bytes, to hand to a process this one starts (an executor). Never log them.
    pub fn expose_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Writes the secret to a new file `path` readable by its owner only (mode 0600); fails if
    /// the file exists (so nothing planted there beforehand is followed or reused).
    pub fn write_new_file(&self, path: &Path) -> Result<(), SecretError> {
        use std::os::unix::fs::OpenOptionsExt;
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|source| SecretError::Create {
                path: path.to_owned(),
                source,
            })?;
        file.write_all(&self.0)
            .and_then(|()| file.write_all(b"\n"))
            .and_then(|()| file.sync_all())
            .map_err(|source| SecretError::Write {
                path: path.to_owned(),
                source,
            })
    }

    /// The proof of `side` over a handshake's transcript.
    fn proof(&self, side: Side, transcript: &[u8]) -> [u8; 32] {
        // HMAC takes keys of any length; `new_from_slice` fails for none.
        let mut mac =
            <Hmac<Sha256> as Mac>::new_from_slice(&self.0).unwrap_or_else(|_| unreachable!());
        mac.update(b"flint-handshake-v3");
        mac.update(side.label());
        mac.update(transcript);
        mac.finalize().into_bytes().into()
    }
}

/// The generator behind [`random_nonce`]: HMAC-SHA256 in counter mode (an HMAC-DRBG without
/// reseeding) keyed with 32 bytes read once from the operating system's random source.
struct Drbg {
    key: [u8; 32],
    counter: u64,
}

static DRBG: OnceLock<Result<Mutex<Drbg>, String>> = OnceLock::new();

fn os_random() -> std::io::Result<[u8; 32]> {
    let mut seed = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut seed)?;
    Ok(seed)
}

/// 32 unpredictable bytes. The generator reads the operating system's random source once per
/// process (the first call) and then needs no file descriptor, so a process at its file limit
/// still gets nonces for the connections it already accepted. The output is HMAC-SHA256 of a
/// counter under the seed: a pseudo-random function, so nonces never repeat within a process
/// and cannot be predicted from the ones a peer has seen.
pub fn random_nonce() -> std::io::Result<[u8; 32]> {
    let drbg = DRBG.get_or_init(|| {
        os_random()
            .map(|key| Mutex::new(Drbg { key, counter: 0 }))
            .map_err(|e| e.to_string())
    });
    let drbg = drbg
        .as_ref()
        .map_err(|e| std::io::Error::other(format!("no random seed: {e}")))?;
    let mut state = drbg.lock().unwrap_or_else(|p| p.into_inner());
    state.counter += 1;
    // HMAC takes keys of any length; `new_from_slice` fails for none.
    let mut mac =
        <Hmac<Sha256> as Mac>::new_from_slice(&state.key).unwrap_or_else(|_| unreachable!());
    mac.update(b"flint-nonce-v1");
    mac.update(&state.counter.to_le_bytes());
    Ok(mac.finalize().into_bytes().into())
}

/// Why a handshake failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    /// The peer's bytes were malformed (including a version mismatch).
    #[error(transparent)]
    Wire(#[from] WireError),
    /// We refused the peer.
    #[error("refused the peer: {0}")]
    Refused(String),
    /// The peer refused us.
    #[error("the peer refused the handshake: {0}")]
    RefusedByPeer(String),
    /// A message that does not belong in the handshake.
    #[error("unexpected {0} during the handshake")]
    Unexpected(&'static str),
}

/// Which end of the connection a handshake is: the one that connected, or the one that
/// accepted. The connector proves itself first; the acceptor only to a connector that has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// Made the connection (an executor, a worker, an application, a status client).
    Connector,
    /// Accepted it (a driver, a master, a worker's status listener).
    Acceptor,
}

impl Side {
    pub(crate) fn label(self) -> &'static [u8] {
        match self {
            Side::Connector => b"connector",
            Side::Acceptor => b"acceptor",
        }
    }

    pub(crate) fn other(self) -> Side {
        match self {
            Side::Connector => Side::Acceptor,
            Side::Acceptor => Side::Connector,
        }
    }
}

/// One side's handshake.
#[derive(Debug)]
pub struct Handshake {
    side: Side,
    role: Role,
    secret: Option<Secret>,
    nonce: [u8; 32],
    accepted_roles: &'static [Role],
    /// The peer's role and nonce, once its `Hello` has arrived.
    peer: Option<(Role, [u8; 32])>,
    /// The connection's seal, once both sides have proved themselves (with a secret, toward a
    /// master or a worker).
    seal: Option<Seal>,
}

impl Handshake {
    /// Starts the handshake of a connection we made, as `role`, to a peer in `peer_roles`;
    /// appends our `Hello`.
    pub fn connect(
        role: Role,
        secret: Option<Secret>,
        nonce: [u8; 32],
        peer_roles: &'static [Role],
        out: &mut BytesMut,
    ) -> Handshake {
        Handshake::start(Side::Connector, role, secret, nonce, peer_roles, out)
    }

    /// Starts the handshake of a connection we accepted, as `role`, from peers in
    /// `accepted_roles`; appends our `Hello`.
    pub fn accept(
        role: Role,
        secret: Option<Secret>,
        nonce: [u8; 32],
        accepted_roles: &'static [Role],
        out: &mut BytesMut,
    ) -> Handshake {
        Handshake::start(Side::Acceptor, role, secret, nonce, accepted_roles, out)
    }

    fn start(
        side: Side,
        role: Role,
        secret: Option<Secret>,
        nonce: [u8; 32],
        accepted_roles: &'static [Role],
        out: &mut BytesMut,
    ) -> Handshake {
        let auth = if secret.is_some() {
            AuthMethod::HmacSha256
        } else {
            AuthMethod::None
        };
        encode(&Message::hello(role, auth, nonce), out);
        Handshake {
            side,
            role,
            secret,
            nonce,
            accepted_roles,
            peer: None,
            seal: None,
        }
    }

    /// Feeds the next frame the peer sent. `Ok(Some(role))` when the peer is authenticated,
    /// `Ok(None)` while more is needed. On an error, a `HandshakeRefused` for the peer has been
    /// appended to `out` where it makes sense; the caller closes after flushing it.
    pub fn on_frame(
        &mut self,
        kind: u16,
        body: &[u8],
        out: &mut BytesMut,
    ) -> Result<Option<Role>, HandshakeError> {
        let result = self.step(kind, body, out);
        if let Err(error) = &result {
            if !matches!(error, HandshakeError::RefusedByPeer(_)) {
                encode(
                    &Message::HandshakeRefused {
                        reason: &error.to_string(),
                    },
                    out,
                );
            }
        }
        result
    }

    /// The seal of a finished handshake whose frames are to be sealed (a shared secret, and a
    /// master or a worker accepting), taken once; `None` otherwise.
    pub fn take_seal(&mut self) -> Option<Seal> {
        self.seal.take()
    }

    fn step(
        &mut self,
        kind: u16,
        body: &[u8],
        out: &mut BytesMut,
    ) -> Result<Option<Role>, HandshakeError> {
        // A peer may refuse us before its `Hello` (its connection table is full).
        let message = match self.peer {
            None if kind != crate::wire::Kind::HandshakeRefused as u16 => {
                Message::decode_hello(kind, body)?
            }
            _ => Message::decode(kind, body)?,
        };
        match (message, self.peer) {
            (
                Message::Hello {
                    role, auth, nonce, ..
                },
                None,
            ) => self.on_hello(role, auth, nonce, out),
            (Message::AuthProof { proof }, Some((peer_role, peer_nonce))) => {
                self.on_proof(&proof, peer_role, &peer_nonce, out)
            }
            (Message::HandshakeRefused { reason }, _) => {
                Err(HandshakeError::RefusedByPeer(reason.to_owned()))
            }
            (other, _) => Err(HandshakeError::Unexpected(other.kind().name())),
        }
    }

    /// The peer's `Hello`: its role and method checked; without a secret it is open, with one
    /// the connector proves itself now.
    fn on_hello(
        &mut self,
        role: Role,
        auth: AuthMethod,
        nonce: [u8; 32],
        out: &mut BytesMut,
    ) -> Result<Option<Role>, HandshakeError> {
        if !self.accepted_roles.contains(&role) {
            return Err(HandshakeError::Refused(format!(
                "a {role} may not connect to a {}",
                self.role
            )));
        }
        let ours = if self.secret.is_some() {
            AuthMethod::HmacSha256
        } else {
            AuthMethod::None
        };
        if auth != ours {
            return Err(HandshakeError::Refused(credentials_mismatch(
                self.role, role, ours,
            )));
        }
        self.peer = Some((role, nonce));
        let Some(secret) = &self.secret else {
            return Ok(Some(role));
        };
        if self.side == Side::Connector {
            let proof = secret.proof(self.side, &self.transcript(role, &nonce));
            encode(&Message::AuthProof { proof }, out);
        }
        Ok(None)
    }

    /// The peer's proof: checked against the transcript; the acceptor then proves itself.
    fn on_proof(
        &mut self,
        proof: &[u8; 32],
        peer_role: Role,
        peer_nonce: &[u8; 32],
        out: &mut BytesMut,
    ) -> Result<Option<Role>, HandshakeError> {
        let Some(secret) = &self.secret else {
            return Err(HandshakeError::Unexpected("AuthProof"));
        };
        let transcript = self.transcript(peer_role, peer_nonce);
        let expected = secret.proof(self.side.other(), &transcript);
        if !crate::seal::same(&expected, proof) {
            return Err(HandshakeError::Refused(WRONG_SECRET.into()));
        }
        if self.side == Side::Acceptor {
            let proof = secret.proof(self.side, &transcript);
            encode(&Message::AuthProof { proof }, out);
        }
        let acceptor = match self.side {
            Side::Acceptor => self.role,
            Side::Connector => peer_role,
        };
        if matches!(acceptor, Role::Master | Role::Worker) {
            self.seal = Some(Seal::new(secret.expose_bytes(), self.side, &transcript));
        }
        Ok(Some(peer_role))
    }

    /// What both sides' proofs cover: the connector's role and the acceptor's, the
    /// connector's nonce and the acceptor's.
    fn transcript(&self, peer_role: Role, peer_nonce: &[u8; 32]) -> [u8; 66] {
        let (connector, acceptor) = match self.side {
            Side::Connector => ((self.role, &self.nonce), (peer_role, peer_nonce)),
            Side::Acceptor => ((peer_role, peer_nonce), (self.role, &self.nonce)),
        };
        let mut transcript = [0u8; 66];
        transcript[0] = connector.0 as u8;
        transcript[1] = acceptor.0 as u8;
        transcript[2..34].copy_from_slice(connector.1);
        transcript[34..].copy_from_slice(acceptor.1);
        transcript
    }
}

/// What a wrong shared secret is called, with what to do about it.
pub const WRONG_SECRET: &str = "bad credentials: wrong shared secret; use the secret the master \
     uses (the file `flint master` printed), with --secret-file PATH or $FLINT_SECRET";

/// Why one side has a secret and the other none, with what to do about it (from the view of
/// `ours`, the side that noticed).
fn credentials_mismatch(me: Role, peer: Role, ours: AuthMethod) -> String {
    let (me, peer) = (
        me.to_string().to_lowercase(),
        peer.to_string().to_lowercase(),
    );
    match ours {
        AuthMethod::None => format!(
            "bad credentials: the {peer} uses a shared secret and this {me} has none; give this \
             {me} the same secret with --secret-file PATH or $FLINT_SECRET (the file `flint \
             master` printed), or run both with --insecure"
        ),
        AuthMethod::HmacSha256 => format!(
            "bad credentials: this {me} requires a shared secret and the {peer} gave none; give \
             the {peer} the secret with --secret-file PATH or $FLINT_SECRET (the file `flint \
             master` printed)"
        ),
    }
}

impl HandshakeError {
    /// Whether the handshake failed over the shared secret (missing, unexpected or wrong):
    /// retrying with the same configuration cannot help.
    pub fn is_credentials(&self) -> bool {
        match self {
            HandshakeError::Refused(reason) | HandshakeError::RefusedByPeer(reason) => {
                reason.starts_with("bad credentials")
            }
            _ => false,
        }
    }
}

fn encode(message: &Message, out: &mut BytesMut) {
    // Handshake messages are a few dozen bytes; a refusal reason is short text we wrote.
    if let Err(error) = message.encode(out, crate::wire::FRAME_SIZE_MAX_DEFAULT) {
        tracing::error!("handshake message not encoded: {error}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::FrameDecoder;

    /// Runs two handshakes against each other until neither has anything to say.
    fn run(
        connector_secret: Option<Secret>,
        acceptor_secret: Option<Secret>,
    ) -> (
        Result<Option<Role>, HandshakeError>,
        Result<Option<Role>, HandshakeError>,
    ) {
        let (mut to_acceptor, mut to_connector) = (BytesMut::new(), BytesMut::new());
        let mut connector = Handshake::connect(
            Role::Executor,
            connector_secret,
            [1; 32],
            &[Role::Driver],
            &mut to_acceptor,
        );
        let mut acceptor = Handshake::accept(
            Role::Driver,
            acceptor_secret,
            [2; 32],
            &[Role::Executor],
            &mut to_connector,
        );
        let (mut c_result, mut a_result) = (Ok(None), Ok(None));
        for _ in 0..4 {
            let inbound = to_acceptor.split();
            deliver(&inbound, &mut acceptor, &mut a_result, &mut to_connector);
            let inbound = to_connector.split();
            deliver(&inbound, &mut connector, &mut c_result, &mut to_acceptor);
        }
        (c_result, a_result)
    }

    fn deliver(
        bytes: &[u8],
        side: &mut Handshake,
        result: &mut Result<Option<Role>, HandshakeError>,
        reply: &mut BytesMut,
    ) {
        let mut decoder = FrameDecoder::new(1024);
        decoder.extend_from_slice(bytes);
        while let Ok(Some(frame)) = decoder.next_frame() {
            if matches!(result, Ok(None)) {
                *result = side.on_frame(frame.kind(), frame.body(), reply);
            }
        }
    }

    fn secret(text: &str) -> Option<Secret> {
        Some(Secret::new(text).expect("non-empty"))
    }

    #[test]
    fn without_secrets_both_sides_learn_the_peer_role() {
        assert_eq!(
            run(None, None),
            (Ok(Some(Role::Driver)), Ok(Some(Role::Executor)))
        );
    }

    #[test]
    fn the_same_secret_authenticates_both_sides() {
        assert_eq!(
            run(secret("s3cret"), secret("s3cret")),
            (Ok(Some(Role::Driver)), Ok(Some(Role::Executor)))
        );
    }

    #[test]
    fn a_wrong_secret_is_refused_as_bad_credentials() {
        let (connector, acceptor) = run(secret("wrong"), secret("right"));
        assert_eq!(acceptor, Err(HandshakeError::Refused(WRONG_SECRET.into())));
        assert!(
            matches!(
                connector,
                Err(HandshakeError::Refused(_)) | Err(HandshakeError::RefusedByPeer(_))
            ),
            "{connector:?}"
        );
    }

    #[test]
    fn a_missing_secret_is_refused() {
        let (connector, acceptor) = run(None, secret("right"));
        assert!(
            matches!(acceptor, Err(HandshakeError::Refused(ref r)) if r.contains("bad credentials")),
            "{acceptor:?}"
        );
        let connector = connector.expect_err("refused");
        assert!(connector.is_credentials(), "{connector}");
        // The side without a secret is told how to give it one.
        let text = connector.to_string();
        assert!(
            text.contains("--secret-file") && text.contains("$FLINT_SECRET"),
            "{text}"
        );
    }

    #[test]
    fn nonces_never_repeat() {
        let first = random_nonce().expect("seeded");
        let nonces: std::collections::HashSet<[u8; 32]> =
            (0..1000).map(|_| random_nonce().expect("nonce")).collect();
        assert_eq!(nonces.len(), 1000);
        assert!(!nonces.contains(&first));
    }

    #[test]
    fn generated_secrets_are_hex_and_differ() {
        let (a, b) = (
            Secret::generate().expect("a"),
            Secret::generate().expect("b"),
        );
        assert_eq!(a.expose_bytes().len(), 64);
        assert!(a.expose_bytes().iter().all(u8::is_ascii_hexdigit));
        assert_ne!(a.expose_bytes(), b.expose_bytes());
    }

    #[test]
    fn a_peer_of_the_wrong_role_is_refused() {
        let mut out = BytesMut::new();
        let mut acceptor =
            Handshake::accept(Role::Driver, None, [0; 32], &[Role::Executor], &mut out);
        let mut hello = BytesMut::new();
        Message::hello(Role::Worker, AuthMethod::None, [0; 32]).encode_body(&mut hello);
        let result = acceptor.on_frame(crate::wire::Kind::Hello as u16, &hello, &mut out);
        assert_eq!(
            result,
            Err(HandshakeError::Refused(
                "a Worker may not connect to a Driver".into()
            ))
        );
    }

    /// Feeds every frame of `bytes` to `side`: the last step's result.
    fn feed(
        side: &mut Handshake,
        bytes: &[u8],
        out: &mut BytesMut,
    ) -> Result<Option<Role>, HandshakeError> {
        let mut decoder = FrameDecoder::new(1024);
        decoder.extend_from_slice(bytes);
        let mut result = Ok(None);
        while let Ok(Some(frame)) = decoder.next_frame() {
            result = side.on_frame(frame.kind(), frame.body(), out);
        }
        result
    }

    fn proofs(bytes: &[u8]) -> Vec<[u8; 32]> {
        crate::transport::frames_of(bytes)
            .iter()
            .filter_map(|f| match f.message() {
                Ok(Message::AuthProof { proof }) => Some(proof),
                _ => None,
            })
            .collect()
    }

    /// Issue 25, item 2: the acceptor proves nothing to a connector that has not proved itself,
    /// so a process without the secret cannot collect a master's proof over its victim's nonce.
    #[test]
    fn an_acceptor_proves_itself_only_after_the_connector_has() {
        let (mut to_master, mut from_master) = (BytesMut::new(), BytesMut::new());
        let mut master = Handshake::accept(
            Role::Master,
            secret("s3cret"),
            [2; 32],
            &[Role::Worker],
            &mut from_master,
        );
        // The relay: a Hello carrying the victim's nonce, and no proof.
        Message::hello(Role::Worker, AuthMethod::HmacSha256, [1; 32])
            .encode(&mut to_master, 1024)
            .expect("fits");
        assert_eq!(
            feed(&mut master, &to_master.split(), &mut from_master),
            Ok(None)
        );
        assert!(
            proofs(&from_master).is_empty(),
            "the master proved itself first"
        );
        // A made-up proof is refused, and still nothing is proved.
        Message::AuthProof { proof: [7; 32] }
            .encode(&mut to_master, 1024)
            .expect("fits");
        let refused = feed(&mut master, &to_master.split(), &mut from_master);
        assert_eq!(refused, Err(HandshakeError::Refused(WRONG_SECRET.into())));
        assert!(proofs(&from_master).is_empty());
    }

    /// A proof names its side and both nonces: an acceptor's proof sent back to it (a
    /// reflection), or the proof of one connection on another, is refused.
    #[test]
    fn a_proof_is_good_for_one_side_of_one_connection() {
        let key = Secret::new("s3cret").expect("secret");
        let mut out = BytesMut::new();
        let acceptor = Handshake::accept(
            Role::Master,
            Some(key.clone()),
            [2; 32],
            &[Role::Worker],
            &mut out,
        );
        let transcript = acceptor.transcript(Role::Worker, &[1; 32]);
        let accepted = key.proof(Side::Acceptor, &transcript);
        assert_ne!(accepted, key.proof(Side::Connector, &transcript));
        let mut other = transcript;
        other[2] ^= 1;
        assert_ne!(accepted, key.proof(Side::Acceptor, &other));
        // Reflected: a connector whose peer answers with the connector's own proof.
        out.clear();
        let mut connector = Handshake::connect(
            Role::Worker,
            Some(key.clone()),
            [1; 32],
            &[Role::Master],
            &mut out,
        );
        let mut hello = BytesMut::new();
        Message::hello(Role::Master, AuthMethod::HmacSha256, [2; 32])
            .encode(&mut hello, 1024)
            .expect("fits");
        out.clear();
        assert_eq!(feed(&mut connector, &hello, &mut out), Ok(None));
        let own = proofs(&out);
        assert_eq!(own.len(), 1);
        let mut reflected = BytesMut::new();
        Message::AuthProof { proof: own[0] }
            .encode(&mut reflected, 1024)
            .expect("fits");
        assert_eq!(
            feed(&mut connector, &reflected, &mut out),
            Err(HandshakeError::Refused(WRONG_SECRET.into()))
        );
    }

    #[test]
    fn connections_to_a_master_or_worker_are_sealed_and_to_a_driver_not() {
        for (acceptor_role, connector_role, sealed) in [
            (Role::Master, Role::Worker, true),
            (Role::Worker, Role::Client, true),
            (Role::Driver, Role::Executor, false),
        ] {
            let (mut to_a, mut to_c) = (BytesMut::new(), BytesMut::new());
            let roles: &'static [Role] = &[
                Role::Master,
                Role::Worker,
                Role::Client,
                Role::Driver,
                Role::Executor,
            ];
            let mut c = Handshake::connect(connector_role, secret("k"), [1; 32], roles, &mut to_a);
            let mut a = Handshake::accept(acceptor_role, secret("k"), [2; 32], roles, &mut to_c);
            let mut results = (Ok(None), Ok(None));
            for _ in 0..3 {
                let bytes = to_a.split();
                if let done @ (Ok(Some(_)) | Err(_)) = feed(&mut a, &bytes, &mut to_c) {
                    results.1 = done;
                }
                let bytes = to_c.split();
                if let done @ (Ok(Some(_)) | Err(_)) = feed(&mut c, &bytes, &mut to_a) {
                    results.0 = done;
                }
            }
            assert_eq!(results, (Ok(Some(acceptor_role)), Ok(Some(connector_role))));
            assert_eq!(c.take_seal().is_some(), sealed);
            assert_eq!(a.take_seal().is_some(), sealed);
        }
    }
}
