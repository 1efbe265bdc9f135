//! Framing: an 8-byte header, then the body.
//!
//! ```text
//! offset  size  field
//!      0     4  body length in bytes (u32 LE), at most the connection's maximum frame size
//!      4     2  message kind (u16 LE), see `Kind`
//!      6     2  flags (u16 LE): bit 0 sealed (the body ends with a tag, see `crate::seal`),
//!               the others reserved: must be zero in this version
//!      8     n  body
//! ```
//!
//! [`FrameDecoder`] turns a byte stream, arriving in chunks of any size, into [`Frame`]s. It reads
//! the length from the header and refuses an oversize frame before its buffer grows, so what a
//! peer can make it hold is bounded by the maximum frame size plus one read. A frame's body is a
//! `Bytes` split off the receive buffer, not a copy; messages decoded from it borrow from it.

use std::io::{self, Read};

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::message::{Kind, Message};
use super::WireError;

/// Bytes in a frame header.
pub const HEADER_LEN: usize = 8;

/// The default maximum body size of a frame: 16 MiB.
pub const FRAME_SIZE_MAX_DEFAULT: usize = 16 * 1024 * 1024;

/// The header flag of a sealed frame: its body ends with a [`SEAL_TAG_LEN`]-byte tag.
pub const FLAG_SEALED: u16 = 1;

/// Bytes of a sealed frame's tag (its body's last ones; the length in the header counts them).
pub const SEAL_TAG_LEN: usize = 16;

/// The most the decoder reads from a socket in one call when no frame is pending.
const READ_CHUNK_LEN: usize = 64 * 1024;

/// One received frame: its kind and its body (a sealed one's with its tag).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    kind: u16,
    body: Bytes,
    sealed: bool,
}

impl Frame {
    /// A frame from its parts (for tests and tools; connections get frames from the decoder).
    pub fn new(kind: u16, body: Bytes) -> Self {
        Frame {
            kind,
            body,
            sealed: false,
        }
    }

    /// Whether it came sealed: its body ends with a tag, and only the connection's
    /// `crate::seal::Seal` makes a message of it.
    pub fn is_sealed(&self) -> bool {
        self.sealed
    }

    /// The raw message kind from the header.
    pub fn kind(&self) -> u16 {
        self.kind
    }

    /// The body.
    pub fn body(&self) -> &Bytes {
        &self.body
    }

    /// Decodes the message. Strings and byte strings in it borrow from this frame's body.
    pub fn message(&self) -> Result<Message<'_>, WireError> {
        if self.sealed {
            return Err(WireError::Sealed);
        }
        Message::decode(self.kind, &self.body)
    }

    /// An owned `Bytes` for a part of a message decoded from this frame (a task's payload, say),
    /// sharing this frame's buffer rather than copying it. A slice from elsewhere is copied.
    pub fn share(&self, part: &[u8]) -> Bytes {
        self.share_or_copy(part)
    }

    /// `part` as a `Bytes` to keep after the frame is gone (a task's result that a job holds):
    /// shared only when it is at least [`RETAIN_SHARE_MIN_BYTES`] long and most of the frame,
    /// copied otherwise, so a small part never keeps a large frame (or the receive buffer it
    /// was split from) alive. Memory held is then at most about twice what is retained.
    pub fn retain(&self, part: &[u8]) -> Bytes {
        if part.is_empty() {
            // The usual result of a task that returns nothing: no copy to make.
            Bytes::new()
        } else if part.len() >= RETAIN_SHARE_MIN_BYTES
            && part.len().saturating_mul(2) >= self.body.len()
        {
            self.share_or_copy(part)
        } else {
            Bytes::copy_from_slice(part)
        }
    }

    fn share_or_copy(&self, part: &[u8]) -> Bytes {
        let body = self.body.as_ptr_range();
        let part_range = part.as_ptr_range();
        if part.is_empty() {
            Bytes::new()
        } else if body.start <= part_range.start && part_range.end <= body.end {
            self.body.slice_ref(part)
        } else {
            Bytes::copy_from_slice(part)
        }
    }
}

/// Parts at least this long that are most of their frame are shared by [`Frame::retain`]; shorter
/// ones are copied (one receive buffer read is at most this long too).
pub const RETAIN_SHARE_MIN_BYTES: usize = READ_CHUNK_LEN;

/// Reads a header: `(body length, kind, flags)`, or `None` if fewer than [`HEADER_LEN`] bytes.
fn parse_header(buf: &[u8]) -> Option<(usize, u16, u16)> {
    let (header, _) = buf.split_first_chunk::<HEADER_LEN>()?;
    let [l0, l1, l2, l3, k0, k1, f0, f1] = *header;
    Some((
        u32::from_le_bytes([l0, l1, l2, l3]) as usize,
        u16::from_le_bytes([k0, k1]),
        u16::from_le_bytes([f0, f1]),
    ))
}

thread_local! {
    /// Where reads of up to [`READ_CHUNK_LEN`] land first (see [`FrameDecoder::read_from`]).
    static SCRATCH: std::cell::RefCell<Box<[u8]>> =
        std::cell::RefCell::new(vec![0; READ_CHUNK_LEN].into_boxed_slice());
}

/// The least a read buffer is allocated with: small frames (a launch batch, a frame of status
/// updates) follow one another in one allocation, not one each. It is also the most a
/// connection's idle read buffer may hold ([`FrameDecoder::allocated`]).
pub const READ_BUFFER_MIN: usize = 4096;

/// Turns a byte stream into frames, whatever the chunking.
#[derive(Debug)]
pub struct FrameDecoder {
    buf: BytesMut,
    /// Bytes in `buf`'s allocation (0 before the first read): every allocation is made in
    /// [`FrameDecoder::make_room`], so it is known.
    allocated: usize,
    frame_size_max: usize,
}

impl FrameDecoder {
    /// A decoder that refuses bodies larger than `frame_size_max` bytes.
    pub fn new(frame_size_max: usize) -> Self {
        FrameDecoder {
            buf: BytesMut::new(),
            allocated: 0,
            frame_size_max,
        }
    }

    /// Bytes of the allocation the buffer is in (0 until the first read). Frames handed out
    /// share it, so it may outlive the decoder.
    pub fn allocated(&self) -> usize {
        self.allocated
    }

    /// Room for `additional` more bytes: in the buffer's allocation if it has it, or has it
    /// once what is buffered moves to its front (possible when no frame handed out still
    /// holds part of it), else in a new allocation of at least [`READ_BUFFER_MIN`] bytes that
    /// takes what is buffered.
    fn make_room(&mut self, additional: usize) {
        if self.buf.capacity() - self.buf.len() >= additional || self.buf.try_reclaim(additional) {
            return;
        }
        let size = (self.buf.len() + additional).max(READ_BUFFER_MIN);
        let mut fresh = BytesMut::with_capacity(size);
        fresh.extend_from_slice(&self.buf);
        self.allocated = fresh.capacity();
        self.buf = fresh;
    }

    /// Bytes received and not yet returned as frames.
    pub fn buffered_len(&self) -> usize {
        self.buf.len()
    }

    /// Bytes the buffer holds room for (0 until the first read).
    pub fn capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// Appends received bytes.
    pub fn extend_from_slice(&mut self, data: &[u8]) {
        self.make_room(data.len());
        self.buf.extend_from_slice(data);
    }

    /// Reads once from `source` into the buffer: as much as the pending frame still needs, or up
    /// to 64 KiB when none is pending. Returns what `read` returned (0 at end of stream).
    ///
    /// A read of up to 64 KiB goes through a scratch buffer of this thread's (allocated and
    /// zeroed once), and only the bytes that came are appended: the buffer holds what was
    /// received, not 64 KiB that had to be zeroed for every read. A frame larger than that is
    /// read straight into the buffer.
    pub fn read_from(&mut self, source: &mut impl Read) -> io::Result<usize> {
        self.read_some(source).map(|(got, _)| got)
    }

    /// [`read_from`](Self::read_from), also saying whether the read filled all the room it
    /// was given. A stream socket's read hands over everything it holds up to that room, so a
    /// read that did not fill it found the socket drained at that moment.
    pub fn read_some(&mut self, source: &mut impl Read) -> io::Result<(usize, bool)> {
        let pending = match parse_header(&self.buf) {
            Some((len, _, _)) if len <= self.frame_size_max + SEAL_TAG_LEN => {
                (HEADER_LEN + len).saturating_sub(self.buf.len())
            }
            _ => 0,
        };
        if pending <= READ_CHUNK_LEN {
            return SCRATCH.with(|scratch| {
                let mut scratch = scratch.borrow_mut();
                let room = scratch.len();
                let got = source.read(&mut scratch[..])?;
                self.extend_from_slice(scratch.get(..got).unwrap_or_default());
                Ok((got, got == room))
            });
        }
        let start = self.buf.len();
        self.make_room(pending);
        self.buf.resize(start + pending, 0);
        let result = source.read(self.buf.get_mut(start..).unwrap_or_default());
        let got = *result.as_ref().unwrap_or(&0);
        self.buf.truncate(start + got);
        result.map(|got| (got, got == pending))
    }

    /// The next complete frame, `Ok(None)` if more bytes are needed, or the error that makes
    /// this stream unusable (the connection should then be closed).
    pub fn next_frame(&mut self) -> Result<Option<Frame>, WireError> {
        let Some((len, kind, flags)) = parse_header(&self.buf) else {
            return Ok(None);
        };
        let sealed = flags == FLAG_SEALED;
        let max = self.frame_size_max + if sealed { SEAL_TAG_LEN } else { 0 };
        if len > max {
            return Err(WireError::FrameTooLarge { len, max });
        }
        if flags != 0 && !sealed {
            return Err(WireError::ReservedFlags(flags));
        }
        if Kind::from_u16(kind).is_none() {
            return Err(WireError::UnknownKind(kind));
        }
        let frame_len = HEADER_LEN + len;
        if self.buf.len() < frame_len {
            self.make_room(frame_len - self.buf.len());
            return Ok(None);
        }
        self.buf.advance(HEADER_LEN);
        let body = self.buf.split_to(len).freeze();
        Ok(Some(Frame { kind, body, sealed }))
    }
}

/// Appends one frame: header, then whatever `write_body` appends. If the body comes out larger
/// than `frame_size_max`, `out` is left as it was and the error says so.
pub fn encode_frame(
    out: &mut BytesMut,
    kind: Kind,
    frame_size_max: usize,
    write_body: impl FnOnce(&mut BytesMut),
) -> Result<(), WireError> {
    let start = begin_frame(out);
    write_body(out);
    end_frame(out, start, kind, frame_size_max)
}

/// Opens a frame in `out`: appends room for its header and returns where the frame starts, for
/// [`end_frame`] once its body is appended (how a batch is written item by item).
#[inline]
pub(crate) fn begin_frame(out: &mut BytesMut) -> usize {
    let start = out.len();
    out.put_bytes(0, HEADER_LEN);
    start
}

/// Closes the frame [`begin_frame`] opened at `start`: everything after its header is the body.
/// If the body is larger than `frame_size_max`, `out` is cut back to `start` and the error says
/// so.
#[inline]
pub(crate) fn end_frame(
    out: &mut BytesMut,
    start: usize,
    kind: Kind,
    frame_size_max: usize,
) -> Result<(), WireError> {
    let len = out.len() - start - HEADER_LEN;
    let max = frame_size_max.min(u32::MAX as usize);
    if len > max {
        out.truncate(start);
        return Err(WireError::FrameTooLarge { len, max });
    }
    let mut header = [0u8; HEADER_LEN];
    header[..4].copy_from_slice(&(len as u32).to_le_bytes());
    header[4..6].copy_from_slice(&(kind as u16).to_le_bytes());
    if let Some(slot) = out.get_mut(start..start + HEADER_LEN) {
        slot.copy_from_slice(&header);
    }
    Ok(())
}
