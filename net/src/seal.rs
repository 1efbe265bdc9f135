//! Sealed frames: after a handshake with a shared secret toward a master or a worker, every
//! frame each way carries a tag, so a process without the secret that relays a whole connection
//! (the one relay a handshake cannot stop: it forwards both proofs) can read the frames but can
//! neither inject, change, drop, reorder nor replay one.
//!
//! Keys: one per direction, `HMAC(secret, "flint-seal-v3" || side || transcript)`, the side
//! being the sender's (`connector` or `acceptor`) and the transcript the handshake's (both
//! roles, both nonces), so no key serves two connections or both directions. A sealed frame has
//! the header flag [`FLAG_SEALED`] and its body ends with [`SEAL_TAG_LEN`] bytes:
//! `HMAC(key, sequence || kind || body)` cut to 16 bytes, the sequence counting the frames sent
//! that way from 0 (it is not sent: each side counts). The header's length covers the tag.
//!
//! Driver and executor connections are not sealed: their frames are the engine's hot path, and
//! their handshake already keeps a process without the secret from being either.

use bytes::{BufMut, BytesMut};
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::handshake::Side;
use crate::wire::{Frame, WireError, FLAG_SEALED, HEADER_LEN, SEAL_TAG_LEN};

/// One connection's sealing state: a key and a frame count each way.
#[derive(Clone)]
pub struct Seal {
    send: Hmac<Sha256>,
    recv: Hmac<Sha256>,
    sent: u64,
    received: u64,
}

impl std::fmt::Debug for Seal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Seal")
            .field("sent", &self.sent)
            .field("received", &self.received)
            .finish_non_exhaustive()
    }
}

impl Seal {
    /// The seal of `side` of a connection whose handshake had this transcript.
    pub(crate) fn new(secret: &[u8], side: Side, transcript: &[u8]) -> Seal {
        let key = |sender: Side| {
            let mut mac = keyed(secret);
            mac.update(b"flint-seal-v3");
            mac.update(sender.label());
            mac.update(transcript);
            keyed(&mac.finalize().into_bytes())
        };
        Seal {
            send: key(side),
            recv: key(side.other()),
            sent: 0,
            received: 0,
        }
    }

    /// Appends `plain` (whole encoded frames, unsealed) to `out`, each frame sealed.
    pub fn seal(&mut self, plain: &[u8], out: &mut BytesMut) {
        out.reserve(plain.len() + plain.len() / 8 + SEAL_TAG_LEN);
        let mut rest = plain;
        while let Some((header, after)) = rest.split_first_chunk::<HEADER_LEN>() {
            let [l0, l1, l2, l3, k0, k1, _, _] = *header;
            let len = u32::from_le_bytes([l0, l1, l2, l3]) as usize;
            let Some((body, next)) = after.split_at_checked(len) else {
                // Our own encoder wrote these; a cut frame cannot happen.
                tracing::error!("a cut frame was not sealed ({} bytes)", rest.len());
                return;
            };
            let kind = u16::from_le_bytes([k0, k1]);
            let sealed_len = u32::try_from(len + SEAL_TAG_LEN).unwrap_or(u32::MAX);
            out.put_u32_le(sealed_len);
            out.put_u16_le(kind);
            out.put_u16_le(FLAG_SEALED);
            out.extend_from_slice(body);
            out.extend_from_slice(&tag(&self.send, self.sent, kind, body));
            self.sent += 1;
            rest = next;
        }
    }

    /// The frame inside a sealed one, or why it is not the next frame the peer sealed (the
    /// connection must then close).
    pub fn open(&mut self, frame: &Frame) -> Result<Frame, WireError> {
        let body = frame.body();
        let inner_len = body.len().checked_sub(SEAL_TAG_LEN);
        let (true, Some(inner_len)) = (frame.is_sealed(), inner_len) else {
            return Err(WireError::Unsealed);
        };
        let (inner, got) = body.split_at(inner_len);
        let expected = tag(&self.recv, self.received, frame.kind(), inner);
        if !same(&expected, got) {
            return Err(WireError::BadSeal);
        }
        self.received += 1;
        Ok(Frame::new(frame.kind(), body.slice(..inner_len)))
    }
}

/// An HMAC-SHA256 keyed with `key` (any length).
fn keyed(key: &[u8]) -> Hmac<Sha256> {
    // HMAC takes keys of any length; `new_from_slice` fails for none.
    <Hmac<Sha256> as Mac>::new_from_slice(key).unwrap_or_else(|_| unreachable!())
}

/// The tag of frame number `sequence`.
fn tag(key: &Hmac<Sha256>, sequence: u64, kind: u16, body: &[u8]) -> [u8; SEAL_TAG_LEN] {
    let mut mac = key.clone();
    mac.update(&sequence.to_le_bytes());
    mac.update(&kind.to_le_bytes());
    mac.update(body);
    let full = mac.finalize().into_bytes();
    let mut tag = [0u8; SEAL_TAG_LEN];
    tag.copy_from_slice(&full[..SEAL_TAG_LEN]);
    tag
}

/// Whether two byte strings are equal, in time that depends only on their lengths.
pub(crate) fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::{encode, frames_of};
    use crate::wire::{FrameDecoder, Message, FRAME_SIZE_MAX_DEFAULT};

    fn pair() -> (Seal, Seal) {
        let transcript = [7u8; 66];
        (
            Seal::new(b"secret", Side::Connector, &transcript),
            Seal::new(b"secret", Side::Acceptor, &transcript),
        )
    }

    fn sealed(seal: &mut Seal, messages: &[Message<'_>]) -> Vec<Frame> {
        let mut plain = BytesMut::new();
        for message in messages {
            encode(message, &mut plain, FRAME_SIZE_MAX_DEFAULT);
        }
        let mut out = BytesMut::new();
        seal.seal(&plain, &mut out);
        let mut decoder = FrameDecoder::new(FRAME_SIZE_MAX_DEFAULT);
        decoder.extend_from_slice(&out);
        std::iter::from_fn(|| decoder.next_frame().expect("decodes")).collect()
    }

    #[test]
    fn sealed_frames_open_in_order_on_the_other_side_only() {
        let (mut connector, mut acceptor) = pair();
        let frames = sealed(
            &mut connector,
            &[
                Message::StatusRequest {},
                Message::WorkerHeartbeat { worker_id: "w1" },
            ],
        );
        assert!(frames.iter().all(Frame::is_sealed));
        // Not by the sender's own seal (a reflection), not out of order.
        assert_eq!(connector.clone().open(&frames[0]), Err(WireError::BadSeal));
        assert_eq!(acceptor.clone().open(&frames[1]), Err(WireError::BadSeal));
        let opened: Vec<Frame> = frames
            .iter()
            .map(|f| acceptor.open(f).expect("opens"))
            .collect();
        assert_eq!(opened[0].message(), Ok(Message::StatusRequest {}));
        assert_eq!(
            opened[1].message(),
            Ok(Message::WorkerHeartbeat { worker_id: "w1" })
        );
        // Replayed: the count has moved on.
        assert_eq!(acceptor.open(&frames[0]), Err(WireError::BadSeal));
    }

    #[test]
    fn an_injected_changed_or_unsealed_frame_is_refused() {
        let (mut connector, acceptor) = pair();
        let frames = sealed(&mut connector, &[Message::StatusRequest {}]);
        let mut plain = BytesMut::new();
        encode(
            &Message::StatusRequest {},
            &mut plain,
            FRAME_SIZE_MAX_DEFAULT,
        );
        let unsealed = frames_of(&plain).remove(0);
        assert_eq!(acceptor.clone().open(&unsealed), Err(WireError::Unsealed));
        // Another connection's keys (another transcript) do not open it.
        let mut other = Seal::new(b"secret", Side::Acceptor, &[8u8; 66]);
        assert_eq!(other.open(&frames[0]), Err(WireError::BadSeal));
        // A wrong secret does not either.
        let mut wrong = Seal::new(b"wrong", Side::Acceptor, &[7u8; 66]);
        assert_eq!(wrong.open(&frames[0]), Err(WireError::BadSeal));
        assert!(sealed(&mut connector, &[]).is_empty());
    }
}
