//! Stalls (issue 11, items 4-7), each where the defect lives: real `flint executor` and
//! `flint driver` processes, and fake peers over raw TCP speaking the wire protocol (a fake
//! driver that floods an executor, fake executors that lie about their cores, heartbeat and never
//! finish, or never read their socket).

mod common;

use common::{wait_until, DEADLINE};

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use flint_net::driver::{Driver, DriverConfig};
use flint_net::functions::fnv1a64;
use flint_net::handshake::{random_nonce, Handshake};
use flint_net::job::{Job, JobOutcome};
use flint_net::summary::{checksum_of, indexed_payload};
use flint_net::wire::{
    Frame, FrameDecoder, KeyValue, List, Message, Role, TaskLaunch, TaskState,
    FRAME_SIZE_MAX_DEFAULT,
};

/// A blocking framed connection for a fake peer.
struct Wire {
    stream: TcpStream,
    decoder: FrameDecoder,
}

impl Wire {
    /// Completes the handshake as `role`, accepting a peer in `peers`.
    fn handshake(stream: TcpStream, role: Role, peers: &'static [Role]) -> Wire {
        stream.set_nodelay(true).expect("nodelay");
        let mut wire = Wire {
            stream,
            decoder: FrameDecoder::new(FRAME_SIZE_MAX_DEFAULT),
        };
        let mut out = BytesMut::new();
        let nonce = random_nonce().expect("nonce");
        let mut handshake = Handshake::start(role, None, nonce, peers, &mut out);
        wire.write(&out);
        loop {
            let frame = wire.next_frame(DEADLINE).expect("handshake frame");
            let mut out = BytesMut::new();
            let step = handshake
                .on_frame(frame.kind(), frame.body(), &mut out)
                .expect("handshake");
            wire.write(&out);
            if step.is_some() {
                return wire;
            }
        }
    }

    fn write(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("write");
    }

    fn send(&mut self, message: &Message<'_>) {
        let mut out = BytesMut::new();
        message
            .encode(&mut out, FRAME_SIZE_MAX_DEFAULT)
            .expect("encodes");
        self.write(&out);
    }

    /// The next frame within `timeout`, or `None` (timeout or closed).
    fn next_frame(&mut self, timeout: Duration) -> Option<Frame> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(frame) = self.decoder.next_frame().expect("well-formed frames") {
                return Some(frame);
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return None;
            }
            self.stream.set_read_timeout(Some(remaining)).ok()?;
            match self.decoder.read_from(&mut self.stream) {
                Ok(0) => return None,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return None,
            }
        }
    }
}

/// A `flint` child process, killed when dropped.
struct Proc(Child);

impl Proc {
    fn spawn(args: &[&str]) -> Proc {
        Proc(
            Command::new(env!("CARGO_BIN_EXE_flint"))
                .args(args)
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .env_remove("FLINT_SECRET")
                .spawn()
                .expect("spawn flint"),
        )
    }

    fn executor(driver: SocketAddr, id: &str) -> Proc {
        Proc::spawn(&[
            "executor",
            "--driver",
            &driver.to_string(),
            "--id",
            id,
            "--connect-timeout-s",
            "20",
        ])
    }

    /// Waits for the exit (failing the test after `timeout`); the exit code.
    fn wait(&mut self, timeout: Duration) -> Option<i32> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.0.try_wait().expect("try_wait") {
                return status.code();
            }
            assert!(Instant::now() < deadline, "the process did not exit");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Item 7: a `LaunchTasks` of 3,000 attempts naming an unknown function, to a one-core executor
/// whose completion queue holds 2,048. Before the fix its loop thread spun forever pushing the
/// failures into the queue only it drains: no status update, no heartbeat, ever again.
#[test]
fn an_executor_flooded_with_unknown_functions_reports_every_failure_and_keeps_heartbeating() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let mut executor = Proc::executor(addr, "flooded");
    let (stream, _) = listener.accept().expect("the executor connects");
    let mut wire = Wire::handshake(stream, Role::Driver, &[Role::Executor]);
    let frame = wire.next_frame(DEADLINE).expect("registration");
    assert!(matches!(
        frame.message(),
        Ok(Message::RegisterExecutor { cores: 1, .. })
    ));
    let settings = [KeyValue {
        key: "heartbeat_interval_ms",
        value: "50",
    }];
    wire.send(&Message::RegisteredExecutor {
        settings: List::from_items(&settings),
    });
    const TASKS: u64 = 3000;
    let launches: Vec<TaskLaunch<'_>> = (0..TASKS)
        .map(|i| TaskLaunch {
            task_id: i,
            attempt: 0,
            cores: 1,
            function: "no-such-function",
            payload: &[],
        })
        .collect();
    wire.send(&Message::LaunchTasks {
        tasks: List::from_items(&launches),
    });
    let mut failed = std::collections::BTreeSet::new();
    let mut heartbeats_after = 0;
    let deadline = Instant::now() + DEADLINE;
    while failed.len() < TASKS as usize || heartbeats_after < 3 {
        let remaining = deadline.saturating_duration_since(Instant::now());
        let Some(frame) = wire.next_frame(remaining) else {
            panic!(
                "the executor went silent: {} of {TASKS} failures reported, {heartbeats_after} \
                 heartbeats after them",
                failed.len()
            );
        };
        match frame.message().expect("decodes") {
            Message::StatusUpdates { updates } => {
                for u in updates {
                    assert_eq!(u.state, TaskState::Failed, "task {}", u.task_id);
                    assert!(
                        failed.insert(u.task_id),
                        "task {} reported twice",
                        u.task_id
                    );
                }
            }
            Message::Heartbeat { .. } if failed.len() == TASKS as usize => heartbeats_after += 1,
            _ => {}
        }
    }
    wire.send(&Message::StopExecutor {});
    assert_eq!(executor.wait(DEADLINE), Some(0), "stopped cleanly");
}
