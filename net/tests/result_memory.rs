//! Issue 11.3: a small result must not keep its whole receive frame alive. A peer that returns
//! correct 8-byte results, each inside an 8 MiB `StatusUpdates` frame (the rest of the frame is
//! an update for a task that does not exist, which the driver ignores), drove the driver to
//! 3.7 GiB for 435 tasks. This binary holds one test so that the process's resident memory is
//! the driver's.

mod common;

use common::DEADLINE;

use std::io::{Read, Write};
use std::net::TcpStream;

use bytes::{Bytes, BytesMut};
use flint_net::driver::{Driver, DriverConfig};
use flint_net::job::{Job, JobOutcome};
use flint_net::wire::{
    batch, AuthMethod, Frame, FrameDecoder, List, Message, Role, StatusUpdate, TaskState,
    FRAME_SIZE_MAX_DEFAULT,
};

const TASKS: usize = 64;
const FILLER_BYTES: usize = 8 << 20;

/// Resident memory of this process, in bytes.
fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("VmRSS");
    kib * 1024
}

/// The next frame from a blocking socket.
fn next_frame(stream: &mut TcpStream, decoder: &mut FrameDecoder) -> Frame {
    loop {
        if let Some(frame) = decoder.next_frame().expect("the driver sends valid frames") {
            return frame;
        }
        let mut chunk = [0u8; 65536];
        let n = stream.read(&mut chunk).expect("read");
        assert!(n > 0, "the driver closed the connection");
        decoder.extend_from_slice(chunk.get(..n).unwrap_or_default());
    }
}

/// A hostile executor over a raw socket: registers, then answers every launched task with its
/// right result (8 bytes) padded into an 8 MiB frame.
fn padding_executor(addr: std::net::SocketAddr) {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream.set_read_timeout(Some(DEADLINE)).expect("timeout");
    let mut out = BytesMut::new();
    Message::hello(Role::Executor, AuthMethod::None, [7; 32])
        .encode(&mut out, FRAME_SIZE_MAX_DEFAULT)
        .expect("fits");
    Message::RegisterExecutor {
        executor_id: "padder",
        host: "127.0.0.1",
        cores: 1,
        lanes: 1,
        attributes: List::empty(),
    }
    .encode(&mut out, FRAME_SIZE_MAX_DEFAULT)
    .expect("fits");
    stream.write_all(&out).expect("write");
    let mut decoder = FrameDecoder::new(FRAME_SIZE_MAX_DEFAULT);
    let filler = vec![0u8; FILLER_BYTES];
    let mut answered = 0;
    while answered < TASKS {
        let frame = next_frame(&mut stream, &mut decoder);
        let Ok(Message::LaunchTasks { tasks }) = frame.message() else {
            continue;
        };
        for task in tasks {
            let result = task.task_id.to_le_bytes();
            let updates = [
                StatusUpdate {
                    task_id: task.task_id,
                    attempt: task.attempt,
                    state: TaskState::Finished,
                    data: &result,
                },
                StatusUpdate {
                    task_id: u64::MAX,
                    attempt: 0,
                    state: TaskState::Finished,
                    data: &filler,
                },
            ];
            let mut out = BytesMut::new();
            batch::encode_status_updates(&updates, &mut out, FRAME_SIZE_MAX_DEFAULT).expect("fits");
            stream.write_all(&out).expect("write");
            answered += 1;
        }
    }
    // Stay connected until the driver has the results (it stops us after the job).
    let _ = next_frame(&mut stream, &mut decoder);
}

#[test]
fn small_results_in_huge_frames_do_not_pin_the_frames() {
    // One task at a time, so every result comes in a frame of its own.
    let config = DriverConfig {
        tasks_per_core: 1,
        ..DriverConfig::default()
    };
    let driver = Driver::builder()
        .config(config)
        .start()
        .expect("driver starts");
    let addr = driver.local_addr().expect("listening");
    let peer = std::thread::spawn(move || padding_executor(addr));
    driver.wait_for_executors(1, DEADLINE).expect("registers");
    let before = rss_bytes();
    let handle = driver
        .submit(Job::new("noop", vec![Bytes::new(); TASKS]))
        .expect("submitted");
    let results = match handle.wait_timeout(DEADLINE).expect("the job ends") {
        JobOutcome::Succeeded(results) => results,
        other => panic!("the padded results are right: {other:?}"),
    };
    let grown = rss_bytes().saturating_sub(before);
    for (i, result) in results.iter().enumerate() {
        assert_eq!(result.len(), 8, "task {i}");
    }
    let pinned_if_shared = (TASKS * FILLER_BYTES) as u64;
    println!(
        "resident memory grew {} MiB holding {TASKS} 8-byte results (pinning would be {} MiB)",
        grown >> 20,
        pinned_if_shared >> 20
    );
    assert!(
        grown < pinned_if_shared / 4,
        "holding {TASKS} small results grew memory by {grown} bytes"
    );
    let _ = driver.stop_executors(DEADLINE);
    peer.join().expect("the fake executor ends cleanly");
}
