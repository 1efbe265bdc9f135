//! Stalls (issue 11, items 4-7), each where the defect lives: real `flint executor` and
//! `flint driver` processes, and fake peers over raw TCP speaking the wire protocol (a fake
//! driver that floods an executor, fake executors that lie about their cores, heartbeat and never
//! finish, or never read their socket).

mod common;

use common::{wait_until, Gate, DEADLINE};

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use flint_cli::summary::{checksum_of, indexed_payload};
use flint_engine::functions::fnv1a64;
use flint_net::driver::{Driver, DriverConfig, EXECUTOR_CORES_MAX};
use flint_net::handshake::{random_nonce, Handshake};
use flint_net::job::{Job, JobOutcome};
use flint_net::wire::{
    Frame, FrameDecoder, List, Message, Role, TaskLaunch, TaskState, FRAME_SIZE_MAX_DEFAULT,
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
        let mut handshake = Handshake::connect(role, None, nonce, peers, &mut out);
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
    wire.send(&Message::RegisteredExecutor {
        heartbeat_interval_ms: 50,
        lane_key: [0; 32],
    });
    const TASKS: u64 = 3000;
    wire.send(&Message::DefineFunction {
        index: 0,
        name: "no-such-function",
    });
    let launches: Vec<TaskLaunch<'_>> = (0..TASKS)
        .map(|i| TaskLaunch {
            task_id: i,
            attempt: 0,
            cores: 1,
            function: 0,
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

/// How a fake executor behaves once registered.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fake {
    /// Reads (counting the tasks it is given, as its heartbeats say), never finishes a task.
    NeverFinishes,
    /// Heartbeats and never reads its socket again.
    NeverReads,
}

/// An executor over a raw socket that registers, heartbeats every 100 ms, and never finishes.
struct FakeExecutor {
    stop: Arc<AtomicBool>,
    /// Tasks it was given (counted when it reads).
    tasks: Arc<AtomicU64>,
    threads: Vec<std::thread::JoinHandle<()>>,
    stream: TcpStream,
}

impl FakeExecutor {
    /// Registers as `id` claiming `cores`; the driver's refusal reason if it refuses.
    fn register(driver: SocketAddr, id: &str, cores: u32, mode: Fake) -> Result<Self, String> {
        let stream = TcpStream::connect(driver).expect("connect");
        let mut wire = Wire::handshake(stream, Role::Executor, &[Role::Driver]);
        wire.send(&Message::RegisterExecutor {
            executor_id: id,
            host: "127.0.0.1",
            cores,
            lanes: 1,
            attributes: List::empty(),
        });
        let frame = wire
            .next_frame(DEADLINE)
            .expect("an answer to the registration");
        match frame.message().expect("decodes") {
            Message::RegisteredExecutor { .. } => {}
            Message::RegisterExecutorFailed { reason } => return Err(reason.to_owned()),
            other => panic!("unexpected {}", other.kind().name()),
        }
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = Arc::new(AtomicU64::new(0));
        let stream = wire.stream.try_clone().expect("clone");
        let mut threads = Vec::new();
        let mut beat = wire.stream.try_clone().expect("clone");
        let (beat_stop, name, held) = (stop.clone(), id.to_owned(), tasks.clone());
        threads.push(std::thread::spawn(move || {
            while !beat_stop.load(Ordering::SeqCst) {
                let mut out = BytesMut::new();
                // It reports what it read: an executor that counts its launches is held to them
                // by the stall rules, not lost as one that does not read.
                let running = u32::try_from(held.load(Ordering::SeqCst)).unwrap_or(u32::MAX);
                let heartbeat = Message::Heartbeat {
                    executor_id: &name,
                    running_tasks: running,
                    metrics: List::empty(),
                };
                heartbeat
                    .encode(&mut out, FRAME_SIZE_MAX_DEFAULT)
                    .expect("encodes");
                if beat.write_all(&out).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }));
        if mode == Fake::NeverFinishes {
            let (read_stop, counted) = (stop.clone(), tasks.clone());
            threads.push(std::thread::spawn(move || {
                while !read_stop.load(Ordering::SeqCst) {
                    let Some(frame) = wire.next_frame(Duration::from_millis(100)) else {
                        continue;
                    };
                    if let Ok(Message::LaunchTasks { tasks }) = frame.message() {
                        counted.fetch_add(tasks.len() as u64, Ordering::SeqCst);
                    }
                }
            }));
        }
        Ok(FakeExecutor {
            stop,
            tasks,
            threads,
            stream,
        })
    }

    fn tasks(&self) -> u64 {
        self.tasks.load(Ordering::SeqCst)
    }
}

impl Drop for FakeExecutor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

fn hash_payloads(tasks: u64, payload: usize) -> (Vec<Bytes>, u64) {
    let payloads: Vec<Bytes> = (0..tasks)
        .map(|i| Bytes::from(indexed_payload(i, payload)))
        .collect();
    let expected = payloads
        .iter()
        .fold(0u64, |sum, p| sum.wrapping_add(fnv1a64(p)));
    (payloads, expected)
}

/// Runs a `hash` job and checks every result.
fn run_hash_job(driver: &Driver, tasks: u64, payload: usize) {
    let (payloads, expected) = hash_payloads(tasks, payload);
    let outcome = driver
        .submit(Job::new("hash", payloads))
        .expect("submitted")
        .wait_timeout(DEADLINE)
        .unwrap_or_else(|_| panic!("the job did not finish within {DEADLINE:?}"));
    let JobOutcome::Succeeded(results) = outcome else {
        panic!("the job failed: {outcome:?}");
    };
    assert_eq!(results.len() as u64, tasks);
    let checksum = results
        .iter()
        .fold(0u64, |sum, r| sum.wrapping_add(checksum_of(r)));
    assert_eq!(checksum, expected);
}

/// Items 4 and 5, with the driver's defaults: an executor claiming 2^31-1 cores is refused with
/// the reason; one claiming the most allowed, heartbeating and never finishing, holds only its
/// slow-start window (before: 1024 x 256 slots, every task of the job, which never ended) and its
/// tasks are copied to the real executor, which finishes the job.
#[test]
fn a_lying_executor_is_refused_over_the_core_bound_and_one_that_never_finishes_holds_few_tasks() {
    let driver = Driver::builder()
        .config(DriverConfig::default())
        .start()
        .expect("driver");
    let addr = driver.local_addr().expect("addr");
    let refused = FakeExecutor::register(addr, "greedy", i32::MAX as u32, Fake::NeverFinishes);
    let reason = refused.err().expect("2^31-1 cores are refused");
    assert!(reason.contains(&EXECUTOR_CORES_MAX.to_string()), "{reason}");
    let liar = FakeExecutor::register(addr, "liar", EXECUTOR_CORES_MAX, Fake::NeverFinishes)
        .expect("within the bound");
    let _real = Proc::executor(addr, "real");
    driver.wait_for_executors(2, DEADLINE).expect("registered");
    const TASKS: u64 = 3000;
    run_hash_job(&driver, TASKS, 8);
    let held = liar.tasks();
    eprintln!("the lying executor was given {held} of {TASKS} tasks");
    let slow_start = DriverConfig::default().scheduler.slow_start_slots;
    assert!(held <= u64::from(slow_start), "held {held}");
    let stats = driver.stats();
    assert!(stats.speculative_launched >= held, "{stats:?}");
    assert_eq!(
        driver.stalled_executors().expect("answers"),
        vec!["liar".to_owned()],
        "named, and given no more work"
    );
}

/// Item 4: an executor that heartbeats and never reads its socket (so never sees its tasks).
#[test]
fn an_executor_that_heartbeats_and_never_reads_does_not_stall_a_job() {
    let driver = Driver::builder()
        .config(DriverConfig::default())
        .start()
        .expect("driver");
    let addr = driver.local_addr().expect("addr");
    let _deaf = FakeExecutor::register(addr, "deaf", 4, Fake::NeverReads).expect("registers");
    let _real = Proc::executor(addr, "real");
    driver.wait_for_executors(2, DEADLINE).expect("registered");
    run_hash_job(&driver, 2000, 8);
}

/// Item 4: an executor that does not read while the driver has more to send than the socket
/// buffers hold is lost after `heartbeat_timeout` of no write progress (it would otherwise
/// keep its tasks, and the driver their bytes, for as long as it heartbeats).
#[test]
fn an_executor_that_does_not_read_its_launches_is_lost() {
    let config = DriverConfig {
        heartbeat_timeout: Duration::from_secs(2),
        heartbeat_interval: Duration::from_millis(100),
        ..DriverConfig::default()
    };
    let driver = Driver::builder().config(config).start().expect("driver");
    let addr = driver.local_addr().expect("addr");
    let deaf = FakeExecutor::register(addr, "deaf", 4, Fake::NeverReads).expect("registers");
    driver.wait_for_executors(1, DEADLINE).expect("registered");
    // 16 launches of 4 MiB each: more than loopback socket buffers take.
    let (payloads, _) = hash_payloads(16, 4 << 20);
    let handle = driver
        .submit(Job::new("hash", payloads))
        .expect("submitted");
    wait_until("the deaf executor to be lost", || {
        driver.executors_lost() == 1
    });
    drop(deaf);
    let _real = Proc::executor(addr, "real");
    let outcome = handle.wait_timeout(DEADLINE).expect("finishes");
    assert!(matches!(outcome, JobOutcome::Succeeded(ref r) if r.len() == 16));
}

/// Item 6, the embedding API: with every executor gone mid-job, `no_executor_for` says so (and
/// the driver warns every few seconds); an executor coming back clears it and finishes the job.
#[test]
fn the_driver_says_how_long_tasks_have_waited_with_no_executor() {
    let driver = Driver::builder()
        .config(DriverConfig::default())
        .start()
        .expect("driver");
    let addr = driver.local_addr().expect("addr");
    assert_eq!(driver.no_executor_for(), None, "nothing waits");
    let mut first = Proc::executor(addr, "first");
    driver.wait_for_executors(1, DEADLINE).expect("registered");
    let (payloads, expected) = hash_payloads(400, 8);
    let gate = Gate::new();
    let handle = driver
        .submit(Job::new(gate.task(), payloads))
        .expect("submitted");
    // Killed while it provably holds attempts (at the gate): the job cannot end before the test
    // opens the gate, so its tasks wait with no executor for as long as the test looks.
    wait_until("the first executor holding attempts", || {
        driver
            .executors_view()
            .is_ok_and(|view| view.running_tasks > 0)
    });
    first.kill();
    wait_until("the driver to notice", || {
        driver
            .no_executor_for()
            .is_some_and(|d| d >= Duration::from_millis(300))
    });
    let _second = Proc::executor(addr, "second");
    wait_until("the second executor holding attempts", || {
        driver.executors_view().is_ok_and(|view| {
            (view.executors.iter()).any(|(id, running)| id == "second" && *running > 0)
        })
    });
    // Checked every 100 ms: cleared once the check sees an executor that can run them.
    wait_until("the driver to see an executor again", || {
        driver.no_executor_for().is_none()
    });
    assert_eq!(
        handle.tasks_done(),
        0,
        "nothing finished while the gate was shut"
    );
    gate.open();
    let outcome = handle.wait_timeout(DEADLINE).expect("finishes");
    let JobOutcome::Succeeded(results) = outcome else {
        panic!("the job failed: {outcome:?}");
    };
    assert_eq!(results.len(), 400);
    let checksum = results
        .iter()
        .fold(0u64, |sum, r| sum.wrapping_add(checksum_of(r)));
    assert_eq!(checksum, expected);
    assert_eq!(driver.no_executor_for(), None);
}

/// Item 6, the CLI: every executor killed by a crashing task; `flint driver` fails after
/// `--no-executor-timeout-s` instead of waiting forever.
#[test]
fn flint_driver_gives_up_after_the_no_executor_timeout() {
    let port = common::free_port();
    let listen = format!("127.0.0.1:{port}");
    let start = Instant::now();
    let mut driver = Proc::spawn(&[
        "driver",
        "--listen",
        &listen,
        "--executors",
        "1",
        "--tasks",
        "20",
        "--task",
        "crash:1",
        "--no-executor-timeout-s",
        "2",
        "--json",
    ]);
    let _executor = Proc::executor(listen.parse().expect("addr"), "doomed");
    let code = driver.wait(DEADLINE);
    assert_eq!(code, Some(2), "fails with an error");
    assert!(
        start.elapsed() >= Duration::from_secs(2),
        "not before the timeout"
    );
    let mut stdout = String::new();
    use std::io::Read;
    if let Some(out) = driver.0.stdout.as_mut() {
        let _ = out.read_to_string(&mut stdout);
    }
    assert!(stdout.is_empty(), "no summary: {stdout}");
    // Out of range: refused when parsed.
    for bad in ["0", "86401", "x"] {
        let mut refused =
            Proc::spawn(&["driver", "--executors", "1", "--no-executor-timeout-s", bad]);
        assert_eq!(
            refused.wait(DEADLINE),
            Some(2),
            "--no-executor-timeout-s {bad}"
        );
    }
}
