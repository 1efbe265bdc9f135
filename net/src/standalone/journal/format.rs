//! The journal's bytes: a file header, then records that each say where they start and whether
//! they are whole, so damage anywhere costs only the records it touches.
//!
//! ```text
//! file    "FLJRNL02" (8 bytes), then records
//! record  magic F1 1A 7E C0 | body length u32 LE | kind u16 LE | 0u16 | check u64 LE | body
//!         check = FNV-1a 64 over the length, kind and body bytes; the body is the message's
//!         wire encoding (the frame body of that kind), so the wire decoder's checks guard it
//! ```
//!
//! A reader that meets a record that does not check out scans on for the next magic that
//! starts one that does: everything between is the damage, reported as (offset, bytes).
//! Journals written before this format (plain wire frames, no header) are still read; in
//! them a damaged record ends the replay, and the rest is reported as damage.

use bytes::{BufMut, BytesMut};

use crate::wire::{FrameDecoder, Message, FRAME_SIZE_MAX_DEFAULT};

/// The first bytes of a journal in this format.
pub(super) const FILE_MAGIC: &[u8; 8] = b"FLJRNL02";
/// The first bytes of every record.
const RECORD_MAGIC: [u8; 4] = [0xF1, 0x1A, 0x7E, 0xC0];
/// Bytes before a record's body.
const RECORD_HEADER_LEN: usize = 20;
/// The longest record body: a wire frame's.
const RECORD_BODY_MAX: usize = FRAME_SIZE_MAX_DEFAULT;

/// A range of bytes that held no valid record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Damage {
    /// Where it starts in the file.
    pub offset: usize,
    /// How long it is.
    pub len: usize,
}

/// Appends one record holding `message`.
pub(super) fn encode_record(message: &Message<'_>, out: &mut BytesMut) {
    let start = out.len();
    out.put_bytes(0, RECORD_HEADER_LEN);
    message.encode_body(out);
    let len = out.len() - start - RECORD_HEADER_LEN;
    if len > RECORD_BODY_MAX {
        out.truncate(start);
        tracing::error!(
            "journal record {} not written: {len} bytes",
            message.kind().name()
        );
        return;
    }
    let kind = message.kind() as u16;
    let len = len as u32;
    let check = checksum(len, kind, &out[start + RECORD_HEADER_LEN..]);
    let header = &mut out[start..start + RECORD_HEADER_LEN];
    header[..4].copy_from_slice(&RECORD_MAGIC);
    header[4..8].copy_from_slice(&len.to_le_bytes());
    header[8..10].copy_from_slice(&kind.to_le_bytes());
    header[12..20].copy_from_slice(&check.to_le_bytes());
}

/// FNV-1a 64 over a record's length, kind and body.
fn checksum(len: u32, kind: u16, body: &[u8]) -> u64 {
    let fnv = |hash: u64, byte: &u8| (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3);
    let head = len
        .to_le_bytes()
        .iter()
        .chain(&kind.to_le_bytes())
        .fold(0xcbf2_9ce4_8422_2325, fnv);
    body.iter().fold(head, fnv)
}

/// The record at `offset`, if a whole one that checks out starts there: its kind, its body and
/// where the next one starts.
fn record_at(bytes: &[u8], offset: usize) -> Option<(u16, &[u8], usize)> {
    let header = bytes.get(offset..offset.checked_add(RECORD_HEADER_LEN)?)?;
    if header[..4] != RECORD_MAGIC || header[10..12] != [0, 0] {
        return None;
    }
    let len = u32::from_le_bytes(header[4..8].try_into().ok()?);
    let kind = u16::from_le_bytes(header[8..10].try_into().ok()?);
    let check = u64::from_le_bytes(header[12..20].try_into().ok()?);
    if len as usize > RECORD_BODY_MAX {
        return None;
    }
    let start = offset + RECORD_HEADER_LEN;
    let end = start + len as usize;
    let body = bytes.get(start..end)?;
    (checksum(len, kind, body) == check).then_some((kind, body, end))
}

/// Where the next record that checks out starts after a damaged one at `offset` (the file's
/// end if none does).
fn next_record(bytes: &[u8], offset: usize) -> usize {
    let mut at = offset + 1;
    while let Some(found) = bytes
        .get(at..)
        .and_then(|rest| rest.iter().position(|b| *b == RECORD_MAGIC[0]))
    {
        at += found;
        if record_at(bytes, at).is_some() {
            return at;
        }
        at += 1;
    }
    bytes.len()
}

/// Reads a journal: calls `apply(offset, message)` for each record that checks out and decodes,
/// in order; the damaged ranges, in order.
pub(crate) fn read(bytes: &[u8], mut apply: impl FnMut(usize, Message<'_>)) -> Vec<Damage> {
    let Some(records) = bytes.strip_prefix(FILE_MAGIC) else {
        return read_legacy(bytes, apply);
    };
    let base = FILE_MAGIC.len();
    let mut damage = Vec::new();
    let mut offset = 0;
    while offset < records.len() {
        match record_at(records, offset) {
            Some((kind, body, next)) => {
                match Message::decode(kind, body) {
                    Ok(message) => apply(base + offset, message),
                    // Whole and checked, but not a message this version knows: skipped.
                    Err(error) => tracing::warn!(
                        "journal: record at offset {} ({} bytes) skipped: {error}",
                        base + offset,
                        next - offset
                    ),
                }
                offset = next;
            }
            None => {
                let next = next_record(records, offset);
                damage.push(Damage {
                    offset: base + offset,
                    len: next - offset,
                });
                offset = next;
            }
        }
    }
    damage
}

/// Reads a journal of plain wire frames (before `FLJRNL02`): a damaged frame ends it.
fn read_legacy(bytes: &[u8], mut apply: impl FnMut(usize, Message<'_>)) -> Vec<Damage> {
    let mut decoder = FrameDecoder::new(FRAME_SIZE_MAX_DEFAULT);
    decoder.extend_from_slice(bytes);
    loop {
        let offset = bytes.len() - decoder.buffered_len();
        let frame = match decoder.next_frame() {
            Ok(Some(frame)) => frame,
            Ok(None) if offset == bytes.len() => return Vec::new(),
            Ok(None) | Err(_) => {
                let len = bytes.len() - offset;
                return vec![Damage { offset, len }];
            }
        };
        match frame.message() {
            Ok(message) => apply(offset, message),
            Err(_) => {
                let len = bytes.len() - offset;
                return vec![Damage { offset, len }];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn journal(messages: &[Message<'_>]) -> Vec<u8> {
        let mut out = BytesMut::from(&FILE_MAGIC[..]);
        for message in messages {
            encode_record(message, &mut out);
        }
        out.to_vec()
    }

    fn heartbeat(id: &str) -> Message<'_> {
        Message::WorkerHeartbeat { worker_id: id }
    }

    fn ids(bytes: &[u8]) -> (Vec<String>, Vec<Damage>) {
        let mut ids = Vec::new();
        let damage = read(bytes, |_, message| {
            if let Message::WorkerHeartbeat { worker_id } = message {
                ids.push(worker_id.to_owned());
            }
        });
        (ids, damage)
    }

    #[test]
    fn damage_in_the_middle_costs_only_the_records_it_touches() {
        let bytes = journal(&[heartbeat("a"), heartbeat("b"), heartbeat("c")]);
        let record = (bytes.len() - FILE_MAGIC.len()) / 3;
        let second = FILE_MAGIC.len() + record;
        for at in [
            second,
            second + 4,
            second + 9,
            second + 15,
            second + record - 1,
        ] {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x55;
            let (ids, damage) = ids(&damaged);
            assert_eq!(ids, ["a", "c"], "damage at {at}");
            assert_eq!(
                damage,
                [Damage {
                    offset: second,
                    len: record
                }],
                "damage at {at}"
            );
        }
        // Garbage in between, a cut tail.
        let mut damaged = bytes[..second].to_vec();
        damaged.extend_from_slice(&[0xF1; 37]);
        damaged.extend_from_slice(&bytes[second..bytes.len() - 3]);
        let (ids, damage) = ids(&damaged);
        assert_eq!(ids, ["a", "b"]);
        assert_eq!(damage.len(), 2, "{damage:?}");
        assert_eq!(
            damage[0],
            Damage {
                offset: second,
                len: 37
            }
        );
        assert_eq!(damage[1].offset + damage[1].len, damaged.len());
    }

    #[test]
    fn a_legacy_journal_reads_up_to_its_damage() {
        let mut old = BytesMut::new();
        for id in ["a", "b"] {
            heartbeat(id).encode(&mut old, 1 << 20).expect("encodes");
        }
        let whole = old.len();
        old.extend_from_slice(&[1, 2, 3]);
        let (ids, damage) = ids(&old);
        assert_eq!(ids, ["a", "b"]);
        assert_eq!(
            damage,
            [Damage {
                offset: whole,
                len: 3
            }]
        );
    }
}
