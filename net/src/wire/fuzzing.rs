//! The bodies of the fuzz targets in `fuzz/`. They live here so that `cargo test` replays the
//! committed corpus through the very code the fuzzer runs (`net/tests/fuzz_corpus.rs`).
//!
//! Each body panics only if the decoder breaks one of its promises: a decoded message must
//! re-encode to exactly the bytes it came from and decode again to itself, and the stream
//! decoder must give the same frames (or the same error) however its input is chunked, with a
//! buffer bounded by the maximum frame size.

use bytes::BytesMut;

use super::{Frame, FrameDecoder, Kind, Message, WireError, HEADER_LEN};

/// A small maximum frame size, so the fuzzer reaches the oversize path cheaply.
const FUZZ_FRAME_SIZE_MAX: usize = 4096;

/// Fuzz target `stream`: `data[0]` is a count `n`, the next `n` bytes are chunk lengths, the rest
/// is a byte stream. The stream is decoded whole and in those chunks; the results must agree.
pub fn stream(data: &[u8]) {
    let (plan_len, rest) = data
        .split_first()
        .map_or((0, data), |(n, rest)| (*n as usize, rest));
    let (plan, stream) = rest.split_at(plan_len.min(rest.len()));
    let chunk_lens: Vec<usize> = plan.iter().map(|&len| len as usize + 1).collect();

    let whole = decode_in_chunks(stream, &[]);
    let chunked = decode_in_chunks(stream, &chunk_lens);
    assert_eq!(
        whole, chunked,
        "chunking changed what the stream decoder produced"
    );
    for frame in whole.iter().filter_map(|outcome| outcome.as_ref().ok()) {
        check_message(frame.kind(), frame.body());
    }
}

/// Fuzz target `message`: `data[0]` picks a kind from the table, the rest is its body.
pub fn message(data: &[u8]) {
    let Some((selector, body)) = data.split_first() else {
        return;
    };
    let kind = Kind::ALL[*selector as usize % Kind::ALL.len()];
    check_message(kind as u16, body);
}

/// Fuzz target `handshake`: the bytes a new connection receives. The first frame must be a
/// well-formed `Hello` of our version, or the connection is refused with an error.
pub fn handshake(data: &[u8]) {
    let mut decoder = FrameDecoder::new(FUZZ_FRAME_SIZE_MAX);
    decoder.extend_from_slice(data);
    if let Ok(Some(frame)) = decoder.next_frame() {
        if let Ok(hello) = Message::decode_hello(frame.kind(), frame.body()) {
            assert_eq!(hello.kind(), Kind::Hello);
            check_message(frame.kind(), frame.body());
        }
    }
}

/// Feeds `stream` to a decoder in chunks of the given lengths (cycled; all at once if none) and
/// collects every frame until the first error.
fn decode_in_chunks(stream: &[u8], chunk_lens: &[usize]) -> Vec<Result<Frame, WireError>> {
    let mut decoder = FrameDecoder::new(FUZZ_FRAME_SIZE_MAX);
    let mut outcomes = Vec::new();
    let mut rest = stream;
    let mut lens = chunk_lens.iter().copied().cycle();
    while !rest.is_empty() {
        let len = lens.next().unwrap_or(rest.len()).min(rest.len());
        let (chunk, tail) = rest.split_at(len);
        rest = tail;
        decoder.extend_from_slice(chunk);
        loop {
            match decoder.next_frame() {
                Ok(Some(frame)) => outcomes.push(Ok(frame)),
                Ok(None) => break,
                Err(error) => {
                    outcomes.push(Err(error));
                    return outcomes;
                }
            }
        }
        assert!(
            decoder.buffered_len() < HEADER_LEN + FUZZ_FRAME_SIZE_MAX + len,
            "decoder holds {} bytes, more than one frame and one chunk",
            decoder.buffered_len()
        );
    }
    outcomes
}

/// If `body` decodes as `kind`, it must re-encode to itself and decode again to the same value.
fn check_message(kind: u16, body: &[u8]) {
    let Ok(message) = Message::decode(kind, body) else {
        return;
    };
    let mut encoded = BytesMut::new();
    message.encode_body(&mut encoded);
    assert_eq!(
        &encoded[..],
        body,
        "{:?} did not re-encode to its own bytes",
        message.kind()
    );
    let again = Message::decode(kind, &encoded).expect("a re-encoded message decodes");
    assert_eq!(again, message);
    // Walk every list once more through the trusted path, as a consumer would.
    let _ = format!("{again:?}");
}
