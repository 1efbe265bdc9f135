//! A hostile peer of the simulated driver: it speaks to the driver on a connection of its own
//! and lies. Its modes: bytes that are no protocol at all, a wrong handshake, an insider
//! that handshakes and registers properly (it knows the secret) and then claims to have run
//! tasks it was never given, with the exact bytes an honest run would return, and an
//! interloper that handshakes properly and asks to join an honest executor as one of its lanes
//! with a guessed key. The driver must
//! refuse or close it, and nothing it says may change a job's result (the simulator's ledger
//! knows which runs really happened).

use std::collections::BTreeSet;

use bytes::{Bytes, BytesMut};
use flint_engine::scheduler::{Attempt, TaskId};
use flint_engine::sim::Rng;

use crate::handshake::{Handshake, Secret};
use crate::sim::runner::result_bytes;
use crate::wire::{
    self, batch, AuthMethod, FrameDecoder, List, Message, Role, TaskState, FRAME_SIZE_MAX_DEFAULT,
};

/// The failure text a hostile peer claims; a job's reasons must never hold it.
pub const HOSTILE_REASON: &str = "hostile lie";

/// What a hostile peer does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Random bytes from the start.
    Garbage,
    /// A handshake that is wrong: another role, a frame before `Hello`, a bad magic.
    WrongHandshake,
    /// A proper executor (by its handshake and registration) that reports tasks it never ran.
    Liar,
    /// A proper handshake, then `JoinLane` for another executor with a guessed key: it must
    /// be refused.
    Interloper,
}

/// One hostile peer's state.
#[derive(Debug)]
pub struct Hostile {
    mode: Mode,
    /// The name it registers under (a liar's; possibly an honest executor's).
    name: String,
    out: BytesMut,
    decoder: FrameDecoder,
    handshake: Option<Handshake>,
    registered: bool,
    /// An interloper the driver let in as a lane (a violation the simulator reports).
    joined: bool,
    /// Attempts the driver gave it (it runs none of them, and lies about none of them: a
    /// registered executor's word on its own tasks is all a driver has).
    given: BTreeSet<Attempt>,
    /// Lies told (status updates sent).
    pub lies: u64,
}

impl Hostile {
    /// A hostile peer that starts by queueing its first bytes.
    pub fn new(rng: &mut Rng, mode: Mode, name: String, secret: Option<Secret>) -> Hostile {
        let mut out = BytesMut::new();
        let mut handshake = None;
        match mode {
            Mode::Garbage => {
                let n = rng.range(1, 64) as usize;
                out.extend((0..n).map(|_| rng.next_u64() as u8));
            }
            Mode::WrongHandshake => wrong_handshake(rng, &secret, &mut out),
            Mode::Liar | Mode::Interloper => {
                let nonce = nonce(rng);
                let h =
                    Handshake::connect(Role::Executor, secret, nonce, &[Role::Driver], &mut out);
                handshake = Some(h);
            }
        }
        Hostile {
            mode,
            name,
            out,
            decoder: FrameDecoder::new(FRAME_SIZE_MAX_DEFAULT),
            handshake,
            registered: false,
            joined: false,
            given: BTreeSet::new(),
            lies: 0,
        }
    }

    /// The name it registers under.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the driver accepted its registration.
    pub fn is_registered(&self) -> bool {
        self.registered
    }

    /// Whether the driver let an interloper in as a lane of another executor.
    pub fn has_joined(&self) -> bool {
        self.joined
    }

    /// Bytes from the driver: a liar follows the handshake and registration; the rest ignore
    /// what they hear.
    pub fn handle_bytes(&mut self, bytes: &[u8]) {
        if !matches!(self.mode, Mode::Liar | Mode::Interloper) {
            return;
        }
        self.decoder.extend_from_slice(bytes);
        while let Ok(Some(frame)) = self.decoder.next_frame() {
            if let Some(h) = self.handshake.as_mut() {
                match h.on_frame(frame.kind(), frame.body(), &mut self.out) {
                    Ok(Some(_)) => {
                        self.handshake = None;
                        let register = match self.mode {
                            // Lane 1 of the executor it names, with a key of its own making.
                            Mode::Interloper => Message::JoinLane {
                                executor_id: &self.name,
                                lane: 1,
                                lane_key: [0x5a; 32],
                            },
                            _ => Message::RegisterExecutor {
                                executor_id: &self.name,
                                host: "hostile",
                                cores: 1,
                                lanes: 1,
                                attributes: List::empty(),
                            },
                        };
                        encode(&register, &mut self.out);
                    }
                    Ok(None) => {}
                    Err(_) => return,
                }
                continue;
            }
            match frame.message() {
                Ok(Message::RegisteredExecutor { .. }) => self.registered = true,
                Ok(Message::LaneJoined { .. }) => self.joined = true,
                Ok(Message::LaunchTasks { tasks }) => {
                    self.given.extend(
                        tasks
                            .iter()
                            .map(|t| Attempt::new(TaskId(t.task_id), t.attempt)),
                    );
                }
                _ => {}
            }
        }
    }

    /// Claims results (or failures) for `attempts` (task id, attempt, payload) it was not
    /// given, with the bytes an honest run would return; a peer not registered sends garbage
    /// instead.
    pub fn lie(&mut self, rng: &mut Rng, attempts: &[(u64, u32, Bytes)]) {
        if !self.registered {
            let n = rng.range(1, 32) as usize;
            self.out.extend((0..n).map(|_| rng.next_u64() as u8));
            return;
        }
        let mut owned = Vec::new();
        for (task_id, attempt, payload) in attempts {
            if self
                .given
                .contains(&Attempt::new(TaskId(*task_id), *attempt))
            {
                continue;
            }
            let (state, data) = match rng.range(0, 3) {
                0 => (
                    TaskState::Failed,
                    Bytes::from_static(HOSTILE_REASON.as_bytes()),
                ),
                1 => (TaskState::Running, Bytes::new()),
                _ => (
                    TaskState::Finished,
                    result_bytes(*task_id, *attempt, payload),
                ),
            };
            owned.push((*task_id, *attempt, state, data));
        }
        // And one for a task id no job has.
        owned.push((
            rng.next_u64() | 1 << 63,
            0,
            TaskState::Finished,
            Bytes::new(),
        ));
        let updates: Vec<wire::StatusUpdate> = owned
            .iter()
            .map(|(task_id, attempt, state, data)| wire::StatusUpdate {
                task_id: *task_id,
                attempt: *attempt,
                state: *state,
                data,
            })
            .collect();
        self.lies += updates.len() as u64;
        // Always within a frame: results here are small.
        let _ = batch::encode_status_updates(&updates, &mut self.out, FRAME_SIZE_MAX_DEFAULT);
    }

    /// The bytes it wants sent.
    pub fn poll_transmit(&mut self) -> Option<Bytes> {
        (!self.out.is_empty()).then(|| self.out.split().freeze())
    }
}

fn nonce(rng: &mut Rng) -> [u8; 32] {
    let mut n = [0u8; 32];
    for chunk in n.chunks_mut(8) {
        chunk.copy_from_slice(&rng.next_u64().to_le_bytes()[..chunk.len()]);
    }
    n
}

fn encode(message: &Message<'_>, out: &mut BytesMut) {
    // The hostile peer's own messages are small: they always fit.
    let _ = message.encode(out, FRAME_SIZE_MAX_DEFAULT);
}

/// One of the ways to get a handshake wrong.
fn wrong_handshake(rng: &mut Rng, secret: &Option<Secret>, out: &mut BytesMut) {
    let auth = if secret.is_some() {
        AuthMethod::HmacSha256
    } else {
        AuthMethod::None
    };
    match rng.range(0, 3) {
        // A role the driver does not take.
        0 => encode(&Message::hello(Role::Worker, auth, nonce(rng)), out),
        // Registration before the handshake.
        1 => encode(
            &Message::RegisterExecutor {
                executor_id: "early",
                host: "hostile",
                cores: 4,
                lanes: 2,
                attributes: List::empty(),
            },
            out,
        ),
        // The other authentication method: a credentials mismatch.
        2 => {
            let other = match auth {
                AuthMethod::None => AuthMethod::HmacSha256,
                AuthMethod::HmacSha256 => AuthMethod::None,
            };
            encode(&Message::hello(Role::Executor, other, nonce(rng)), out);
        }
        // A `Hello` with its magic broken.
        _ => {
            let start = out.len();
            encode(&Message::hello(Role::Executor, auth, nonce(rng)), out);
            if let Some(b) = out.get_mut(start + wire::HEADER_LEN) {
                *b ^= 0xff;
            }
        }
    }
}
