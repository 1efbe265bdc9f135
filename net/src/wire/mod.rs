//! Flint's binary wire protocol.
//!
//! Every connection carries frames (see [`frame`]): an 8-byte little-endian header with the body
//! length and the message kind, then the body. The first frame each side sends is a
//! [`Message::Hello`] (magic, protocol version, role, authentication method and a nonce); a peer
//! with another version gets [`WireError::VersionMismatch`].
//!
//! Decoding is zero-copy and never trusts the peer: a [`FrameDecoder`] yields [`Frame`]s whose
//! bodies are `Bytes` split from the receive buffer; [`Frame::message`] gives a [`Message`] that
//! borrows from the body; batches ([`List`]) are validated once and iterate without allocating.
//! Every malformed input is a [`WireError`]; nothing panics, reads past the frame, or allocates
//! more than the frame's size. Encoding appends frames to a `BytesMut`, so a batch of frames
//! goes out in one write.

pub mod batch;
pub mod codec;
mod error;
pub mod frame;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod limits;
pub mod message;

pub use codec::{Field, List, ListIter, Reader};
pub use error::WireError;
pub use frame::{
    encode_frame, Frame, FrameDecoder, FLAG_SEALED, FRAME_SIZE_MAX_DEFAULT, HEADER_LEN,
    READ_BUFFER_MIN, SEAL_TAG_LEN,
};
pub use message::{
    AppDescription, AppState, AppStatus, AuthMethod, ExecutorStatus, KeyValue, Kind, Magic,
    Message, Metric, ProcessState, Role, StatusUpdate, TaskLaunch, TaskState, Version, WorkerState,
    WorkerStatus, MAGIC, PROTOCOL_VERSION,
};

#[cfg(test)]
#[doc(hidden)]
pub mod sample;
#[cfg(test)]
mod tests;
