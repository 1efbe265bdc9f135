//! `WireError`: every way a peer's bytes can be wrong, as one typed error.
//!
//! Decoders return it instead of panicking; the connection that produced it is closed with the
//! error's text as the logged reason.

use thiserror::Error;

/// A malformed frame, message or handshake.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum WireError {
    /// A field or a length prefix points past the end of the frame body.
    #[error("truncated: a field needs {needed} bytes but {remaining} remain in the frame")]
    Truncated {
        /// Bytes the field needed.
        needed: usize,
        /// Bytes left in the frame when it was read.
        remaining: usize,
    },
    /// The header announces a body larger than this connection accepts.
    #[error("frame of {len} bytes exceeds the maximum frame size of {max} bytes")]
    FrameTooLarge {
        /// Body length announced by the header (or produced by an encoder).
        len: usize,
        /// The configured maximum.
        max: usize,
    },
    /// The header carries a message kind this version does not know.
    #[error("unknown message kind {0}")]
    UnknownKind(u16),
    /// The header's reserved flags are not zero.
    #[error("reserved header flags are set: {0:#06x}")]
    ReservedFlags(u16),
    /// A sealed frame where none is expected (before the handshake's end, or on a connection
    /// that is not sealed).
    #[error("a sealed frame on a connection that is not sealed")]
    Sealed,
    /// A frame that is not sealed on a sealed connection.
    #[error("a frame that is not sealed on a sealed connection")]
    Unsealed,
    /// A sealed frame whose tag is wrong: changed, injected, replayed, reordered or sealed
    /// with another key.
    #[error("a sealed frame with a wrong tag (changed, injected, replayed or out of order)")]
    BadSeal,
    /// A list count cannot fit in the bytes that remain, even at the smallest item size.
    #[error("list of {count} items cannot fit in the {remaining} bytes left in the frame")]
    CountTooLarge {
        /// The count read off the wire.
        count: u32,
        /// Bytes left in the frame after the count.
        remaining: usize,
    },
    /// A string field is not valid UTF-8.
    #[error("string field is not valid UTF-8")]
    BadUtf8,
    /// The message ended before the frame did.
    #[error("{count} trailing bytes after the message")]
    TrailingBytes {
        /// Bytes left over.
        count: usize,
    },
    /// The handshake does not start with Flint's magic bytes.
    #[error("bad magic {0:02x?}: the peer does not speak the Flint protocol")]
    BadMagic([u8; 4]),
    /// The peer speaks another version of the protocol.
    #[error("protocol version mismatch: we speak {ours}, the peer speaks {theirs}")]
    VersionMismatch {
        /// Our version.
        ours: u16,
        /// The version the peer announced.
        theirs: u16,
    },
    /// An enumerated field holds a value outside its range.
    #[error("invalid value {value} for field `{field}`")]
    InvalidValue {
        /// Which field.
        field: &'static str,
        /// The value read.
        value: u64,
    },
    /// The first frame on a connection was not a handshake.
    #[error("expected the handshake frame first, got message kind {kind}")]
    ExpectedHandshake {
        /// The kind that came instead.
        kind: u16,
    },
}
