//! Property tests and the table of malformed inputs for the wire protocol.

use bytes::{BufMut, BytesMut};
use proptest::prelude::*;

use super::sample::Rng;
use super::*;

/// A random valid body for `kind`.
fn sample_body(kind: Kind, seed: u64) -> BytesMut {
    let mut body = BytesMut::new();
    Message::sample_body(kind, &mut Rng::new(seed), &mut body);
    body
}

/// A frame: header then body, as `encode_frame` writes it.
fn frame_bytes(kind: u16, flags: u16, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&kind.to_le_bytes());
    out.extend_from_slice(&flags.to_le_bytes());
    out.extend_from_slice(body);
    out
}

fn stream_outcome(bytes: &[u8]) -> Result<Option<Frame>, WireError> {
    let mut decoder = FrameDecoder::new(FRAME_SIZE_MAX_DEFAULT);
    decoder.extend_from_slice(bytes);
    decoder.next_frame()
}

fn arb_kind() -> impl Strategy<Value = Kind> {
    (0..Kind::ALL.len()).prop_map(|index| Kind::ALL[index])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// Every message round-trips: a valid body decodes, re-encodes to the same bytes, and the
    /// framed message decodes back to an equal message.
    #[test]
    fn every_message_round_trips(kind in arb_kind(), seed in any::<u64>()) {
        let body = sample_body(kind, seed);
        let message = Message::decode(kind as u16, &body).expect("a sampled body decodes");
        prop_assert_eq!(message.kind(), kind);
        let mut reencoded = BytesMut::new();
        message.encode_body(&mut reencoded);
        prop_assert_eq!(&reencoded[..], &body[..]);

        let mut framed = BytesMut::new();
        message.encode(&mut framed, FRAME_SIZE_MAX_DEFAULT).expect("fits");
        let frame = stream_outcome(&framed).expect("decodes").expect("complete");
        prop_assert_eq!(frame.kind(), kind as u16);
        prop_assert_eq!(frame.message().expect("decodes"), message);
    }

    /// The stream decoder yields exactly the frames that were sent, whatever the chunking.
    #[test]
    fn stream_decoder_ignores_chunking(
        messages in prop::collection::vec((arb_kind(), any::<u64>()), 1..20),
        chunk_lens in prop::collection::vec(1usize..300, 1..50),
    ) {
        let mut sent = Vec::new();
        let mut stream = BytesMut::new();
        for (kind, seed) in messages {
            let body = sample_body(kind, seed);
            stream.extend_from_slice(&frame_bytes(kind as u16, 0, &body));
            sent.push(Frame::new(kind as u16, body.freeze()));
        }
        let mut decoder = FrameDecoder::new(FRAME_SIZE_MAX_DEFAULT);
        let mut received = Vec::new();
        let mut rest = &stream[..];
        for len in chunk_lens.iter().cycle() {
            if rest.is_empty() {
                break;
            }
            let (chunk, tail) = rest.split_at((*len).min(rest.len()));
            rest = tail;
            decoder.extend_from_slice(chunk);
            while let Some(frame) = decoder.next_frame().expect("well-formed stream") {
                received.push(frame);
            }
        }
        prop_assert_eq!(received, sent);
        prop_assert_eq!(decoder.buffered_len(), 0);
    }

    /// Any byte string is a frame or an error, never a panic; same for any body of any kind.
    #[test]
    fn any_bytes_decode_or_fail_cleanly(data in prop::collection::vec(any::<u8>(), 0..512)) {
        fuzzing::stream(&data);
        fuzzing::message(&data);
        fuzzing::handshake(&data);
    }

    /// Mutating one byte of a valid framed message gives a message or an error, never a panic,
    /// and whatever decodes still re-encodes to itself.
    #[test]
    fn mutated_messages_decode_or_fail_cleanly(
        kind in arb_kind(), seed in any::<u64>(), position in any::<usize>(), value in any::<u8>(),
    ) {
        let body = sample_body(kind, seed);
        let mut stream = frame_bytes(kind as u16, 0, &body);
        let index = position % stream.len();
        stream[index] = value;
        fuzzing::stream(&[0].iter().chain(stream.iter()).copied().collect::<Vec<u8>>());
    }
}

/// Each malformed input and the error it must give.
#[test]
fn malformed_inputs_give_their_errors() {
    let max = FRAME_SIZE_MAX_DEFAULT;
    let kill_task = Kind::KillTask as u16;
    let refused = Kind::HandshakeRefused as u16;

    let mut bad_state = BytesMut::new();
    bad_state.put_u32_le(1); // one update
    bad_state.put_u64_le(7);
    bad_state.put_u32_le(0);
    bad_state.put_u8(9); // no TaskState is 9
    bad_state.put_u32_le(0);

    let mut bad_option = BytesMut::new();
    for text in ["app", "exec"] {
        bad_option.put_u32_le(text.len() as u32);
        bad_option.put_slice(text.as_bytes());
    }
    bad_option.put_u8(ProcessState::Exited as u8);
    bad_option.put_u32_le(0); // empty message
    bad_option.put_u8(2); // option tags are 0 or 1

    let mut lying_count = BytesMut::new();
    lying_count.put_u32_le(1_000_000); // a million tasks
    lying_count.put_slice(&[0; 10]); // in ten bytes

    let mut wrong_version = BytesMut::new();
    wrong_version.put_slice(&MAGIC);
    wrong_version.put_u16_le(PROTOCOL_VERSION + 1);

    let mut hello = BytesMut::new();
    Message::hello(Role::Executor, AuthMethod::None, [7; 32]).encode_body(&mut hello);
    let mut bad_magic = hello.clone();
    bad_magic[0] = b'X';

    // (what, kind, body, expected error from Message::decode)
    let bodies: Vec<(&str, u16, Vec<u8>, WireError)> = vec![
        (
            "body ends inside a field",
            kill_task,
            vec![0; 8],
            WireError::Truncated {
                needed: 4,
                remaining: 0,
            },
        ),
        (
            "string length points past the frame",
            refused,
            [&100u32.to_le_bytes()[..], b"abc"].concat(),
            WireError::Truncated {
                needed: 100,
                remaining: 3,
            },
        ),
        (
            "string is not UTF-8",
            refused,
            [&2u32.to_le_bytes()[..], &[0xff, 0xfe]].concat(),
            WireError::BadUtf8,
        ),
        (
            "bytes after the message",
            Kind::HeartbeatAck as u16,
            vec![0],
            WireError::TrailingBytes { count: 1 },
        ),
        (
            "list count larger than the frame can hold",
            Kind::LaunchTasks as u16,
            lying_count.to_vec(),
            WireError::CountTooLarge {
                count: 1_000_000,
                remaining: 10,
            },
        ),
        (
            "enum value out of range",
            Kind::StatusUpdates as u16,
            bad_state.to_vec(),
            WireError::InvalidValue {
                field: "TaskState",
                value: 9,
            },
        ),
        (
            "option tag out of range",
            Kind::ExecutorStateChanged as u16,
            bad_option.to_vec(),
            WireError::InvalidValue {
                field: "option tag",
                value: 2,
            },
        ),
        ("unknown kind", 999, vec![], WireError::UnknownKind(999)),
        (
            "bad magic",
            Kind::Hello as u16,
            bad_magic.to_vec(),
            WireError::BadMagic(*b"XLNT"),
        ),
        (
            "version mismatch",
            Kind::Hello as u16,
            wrong_version.to_vec(),
            WireError::VersionMismatch {
                ours: PROTOCOL_VERSION,
                theirs: PROTOCOL_VERSION + 1,
            },
        ),
    ];
    for (what, kind, body, expected) in bodies {
        assert_eq!(Message::decode(kind, &body), Err(expected), "{what}");
    }

    // Frame-level errors come from the header alone, before the body arrives.
    let frames: Vec<(&str, Vec<u8>, WireError)> = vec![
        (
            "length over the maximum frame size",
            ((max + 1) as u32)
                .to_le_bytes()
                .into_iter()
                .chain([20, 0, 0, 0])
                .collect(),
            WireError::FrameTooLarge { len: max + 1, max },
        ),
        (
            "reserved flags set",
            frame_bytes(kill_task, 2, &[]),
            WireError::ReservedFlags(2),
        ),
        (
            "unknown kind in the header",
            frame_bytes(999, 0, &[]),
            WireError::UnknownKind(999),
        ),
    ];
    for (what, bytes, expected) in frames {
        assert_eq!(stream_outcome(&bytes), Err(expected), "{what}");
    }

    // The first frame of a connection must be the handshake.
    assert_eq!(
        Message::decode_hello(Kind::Heartbeat as u16, &[]),
        Err(WireError::ExpectedHandshake {
            kind: Kind::Heartbeat as u16
        })
    );
    assert_eq!(
        Message::decode_hello(Kind::Hello as u16, &hello),
        Message::decode(Kind::Hello as u16, &hello)
    );
}

#[test]
fn a_truncated_frame_waits_for_more_and_reserves_only_what_its_header_says() {
    let mut body = BytesMut::new();
    Message::HandshakeRefused { reason: "no" }.encode_body(&mut body);
    let frame = frame_bytes(Kind::HandshakeRefused as u16, 0, &body);
    let mut decoder = FrameDecoder::new(64);
    for (index, byte) in frame.iter().enumerate() {
        assert_eq!(
            decoder.next_frame(),
            Ok(None),
            "complete after {index} bytes"
        );
        decoder.extend_from_slice(&[*byte]);
    }
    let decoded = decoder.next_frame().expect("valid").expect("complete");
    assert_eq!(
        decoded.message(),
        Ok(Message::HandshakeRefused { reason: "no" })
    );
}

#[test]
fn an_oversize_message_is_refused_by_the_encoder_and_leaves_the_buffer_as_it_was() {
    let payload = vec![0u8; 100];
    let tasks = [TaskLaunch {
        task_id: 1,
        attempt: 0,
        cores: 1,
        function: 0,
        payload: &payload,
    }];
    let message = Message::LaunchTasks {
        tasks: List::from_items(&tasks),
    };
    let mut out = BytesMut::new();
    Message::HeartbeatAck {}
        .encode(&mut out, 64)
        .expect("empty body fits");
    let before = out.clone();
    let error = message.encode(&mut out, 64).expect_err("too large");
    assert!(
        matches!(error, WireError::FrameTooLarge { max: 64, .. }),
        "{error}"
    );
    assert_eq!(out, before);
}

#[test]
fn a_decoded_batch_iterates_to_the_tasks_that_were_sent_and_shares_their_payloads() {
    let payloads: Vec<Vec<u8>> = (0..100u32)
        .map(|i| i.to_le_bytes().repeat(i as usize % 7))
        .collect();
    let tasks: Vec<TaskLaunch> = payloads
        .iter()
        .enumerate()
        .map(|(i, payload)| TaskLaunch {
            task_id: i as u64,
            attempt: 1,
            cores: 1,
            function: 3,
            payload,
        })
        .collect();
    let mut out = BytesMut::new();
    Message::LaunchTasks {
        tasks: List::from_items(&tasks),
    }
    .encode(&mut out, FRAME_SIZE_MAX_DEFAULT)
    .expect("fits");
    let frame = stream_outcome(&out).expect("valid").expect("complete");
    let Ok(Message::LaunchTasks { tasks: received }) = frame.message() else {
        panic!("not a LaunchTasks");
    };
    assert_eq!(received.len(), 100);
    for (got, sent) in received.iter().zip(&tasks) {
        assert_eq!(&got, sent);
        let shared = frame.share(got.payload);
        assert_eq!(&shared[..], sent.payload);
        if !shared.is_empty() {
            // The same memory as the frame body: a view, not a copy.
            let body = frame.body().as_ptr_range();
            assert!(body.contains(&shared.as_ptr()));
        }
    }
}

/// Writes the seed corpus for the fuzz targets: `cargo test -p flint-net -- --ignored write_seed_corpus`.
#[test]
#[ignore = "writes fuzz/corpus; run by hand when the message table changes"]
fn write_seed_corpus() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus");
    let write = |target: &str, name: String, bytes: &[u8]| {
        let dir = root.join(target);
        std::fs::create_dir_all(&dir).expect("create corpus dir");
        std::fs::write(dir.join(name), bytes).expect("write seed");
    };
    for (index, kind) in Kind::ALL.iter().enumerate() {
        for seed in 0..2u64 {
            let body = sample_body(*kind, seed);
            let mut message = vec![index as u8];
            message.extend_from_slice(&body);
            write("message", format!("{}-{seed}", kind.name()), &message);
            let mut stream = vec![3, 1, 7, 200];
            stream.extend(frame_bytes(*kind as u16, 0, &body));
            write("stream", format!("{}-{seed}", kind.name()), &stream);
        }
    }
    let mut hello = BytesMut::new();
    for role in Role::ALL {
        hello.clear();
        Message::hello(*role, AuthMethod::HmacSha256, [1; 32])
            .encode(&mut hello, 1024)
            .expect("fits");
        write("handshake", format!("hello-{role}"), &hello);
    }
}

/// A source handing out its bytes in the chunks given (one chunk at most per read, as a
/// socket hands over what has arrived), then "would block"; it counts its reads.
struct Chunks {
    chunks: std::collections::VecDeque<Vec<u8>>,
    reads: usize,
}

impl std::io::Read for Chunks {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.reads += 1;
        let Some(chunk) = self.chunks.front_mut() else {
            return Err(std::io::ErrorKind::WouldBlock.into());
        };
        let n = chunk.len().min(buf.len());
        buf[..n].copy_from_slice(&chunk[..n]);
        chunk.drain(..n);
        if chunk.is_empty() {
            self.chunks.pop_front();
        }
        Ok(n)
    }
}

#[test]
fn a_read_says_whether_it_filled_its_room_so_a_drained_socket_is_not_read_again() {
    // One frame of 100 KiB: the first read fills the 64 KiB scratch, the second takes the
    // rest and does not fill its room (the socket was drained then).
    let mut frame = BytesMut::new();
    encode_frame(&mut frame, Kind::StatusUpdates, 1 << 20, |out| {
        out.put_bytes(7, 100 * 1024)
    })
    .expect("encodes");
    let mut source = Chunks {
        chunks: [frame.to_vec()].into(),
        reads: 0,
    };
    let mut decoder = FrameDecoder::new(1 << 20);
    let (got, filled) = decoder.read_some(&mut source).expect("reads");
    assert_eq!(
        (got, filled),
        (64 * 1024, true),
        "a full read: more may wait"
    );
    assert_eq!(
        decoder.next_frame().expect("valid"),
        None,
        "not complete yet"
    );
    let (got, filled) = decoder.read_some(&mut source).expect("reads");
    assert_eq!(
        (got, filled),
        (frame.len() - 64 * 1024, false),
        "a short read"
    );
    let whole = decoder.next_frame().expect("valid").expect("complete");
    assert_eq!(whole.body().len(), 100 * 1024);
    assert_eq!(source.reads, 2);
    // A small frame arriving in two pieces: each read is short, and nothing is lost.
    let mut small = BytesMut::new();
    encode_frame(&mut small, Kind::Heartbeat, 1 << 20, |out| {
        out.put_bytes(1, 10)
    })
    .expect("encodes");
    let (head, tail) = small.split_at(5);
    source.chunks = [head.to_vec(), tail.to_vec()].into();
    assert_eq!(decoder.read_some(&mut source).expect("reads"), (5, false));
    assert_eq!(decoder.next_frame().expect("valid"), None);
    assert_eq!(
        decoder.read_some(&mut source).expect("reads"),
        (tail.len(), false)
    );
    let frame = decoder.next_frame().expect("valid").expect("complete");
    assert_eq!(frame.body().len(), 10);
}

/// A launch and a status update, read and written with their fixed head at once, keep the
/// encoding of their fields one by one; a bad state byte and a short head are refused.
#[test]
fn hot_items_keep_the_field_by_field_encoding() {
    use codec::{Field, Reader};
    let mut fields = BytesMut::new();
    fields.put_u64_le(0x0102_0304_0506_0708);
    fields.put_u32_le(3);
    fields.put_u32_le(2);
    fields.put_u32_le(7);
    fields.put_u32_le(5);
    fields.put_slice(b"hello");
    let launch = TaskLaunch {
        task_id: 0x0102_0304_0506_0708,
        attempt: 3,
        cores: 2,
        function: 7,
        payload: b"hello",
    };
    let mut written = BytesMut::new();
    launch.write(&mut written);
    assert_eq!(&written[..], &fields[..]);
    let mut reader = Reader::new(&fields);
    assert_eq!(TaskLaunch::read(&mut reader), Ok(launch));
    reader.finish().expect("every byte read");

    for (state, byte) in [(TaskState::Finished, 2u8), (TaskState::Lost, 5)] {
        let mut fields = BytesMut::new();
        fields.put_u64_le(u64::MAX);
        fields.put_u32_le(1);
        fields.put_u8(byte);
        fields.put_u32_le(0);
        let update = StatusUpdate {
            task_id: u64::MAX,
            attempt: 1,
            state,
            data: b"",
        };
        let mut written = BytesMut::new();
        update.write(&mut written);
        assert_eq!(&written[..], &fields[..], "{state:?}");
        assert_eq!(StatusUpdate::read(&mut Reader::new(&fields)), Ok(update));
    }

    let mut bad_state = BytesMut::new();
    bad_state.put_u64_le(1);
    bad_state.put_u32_le(0);
    bad_state.put_u8(9);
    bad_state.put_u32_le(0);
    assert_eq!(
        StatusUpdate::read(&mut Reader::new(&bad_state)),
        Err(WireError::InvalidValue {
            field: "TaskState",
            value: 9
        })
    );
    assert_eq!(
        StatusUpdate::read(&mut Reader::new(&bad_state[..16])),
        Err(WireError::Truncated {
            needed: 17,
            remaining: 16
        })
    );
    let mut long_payload = fields.clone();
    long_payload.truncate(20);
    long_payload.put_u32_le(6); // one byte more than follows
    long_payload.put_slice(b"hello");
    assert_eq!(
        TaskLaunch::read(&mut Reader::new(&long_payload)),
        Err(WireError::Truncated {
            needed: 6,
            remaining: 5
        })
    );
}
