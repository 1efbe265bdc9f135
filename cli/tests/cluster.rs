//! End-to-end tests with real processes: a driver embedded in the test, `flint executor`
//! processes on 127.0.0.1, real `kill -9` and `SIGSTOP`, raw sockets sending garbage.

mod common;

use common::{unique, wait_until, Gate, DEADLINE};

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use flint_cli::summary::{checksum_of, indexed_payload};
use flint_engine::functions::fnv1a64;
use flint_engine::scheduler::Stats;
use flint_net::driver::{Driver, DriverConfig, ExecutorsView};
use flint_net::handshake::Secret;
use flint_net::job::{Job, JobHandle, JobOutcome};
use flint_net::wire::{AuthMethod, Message, Role, FRAME_SIZE_MAX_DEFAULT};

/// An executor process whose stderr goes to a file the test can read.
struct Executor {
    child: Child,
    log: PathBuf,
}

impl Executor {
    fn start(driver: SocketAddr, id: &str, secret: Option<&str>) -> Executor {
        Executor::start_with(driver, id, secret, &[])
    }

    /// An executor with `args` added to its command line.
    fn start_with(driver: SocketAddr, id: &str, secret: Option<&str>, args: &[&str]) -> Executor {
        let log = std::env::temp_dir().join(format!(
            "flint-test-{}-{id}-{}.log",
            std::process::id(),
            unique()
        ));
        let stderr = std::fs::File::create(&log).expect("log file");
        let mut command = Command::new(env!("CARGO_BIN_EXE_flint"));
        command
            .args([
                "executor",
                "--driver",
                &driver.to_string(),
                "--id",
                id,
                "--connect-timeout-s",
                "10",
            ])
            .args(args)
            .stdout(Stdio::null())
            .stderr(stderr)
            .env_remove("FLINT_SECRET");
        if let Some(secret) = secret {
            command.env("FLINT_SECRET", secret);
        }
        Executor {
            child: command.spawn().expect("spawn flint executor"),
            log,
        }
    }

    fn wait(&mut self) -> ExitStatus {
        let deadline = Instant::now() + DEADLINE;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(Instant::now() < deadline, "executor did not exit");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success(), "kill {signal} failed");
    }

    /// Stops the executor with SIGSTOP and returns once every one of its threads is stopped.
    /// `kill` returns when the signal is queued: the kernel wakes one thread, which then stops
    /// the others, and on a loaded machine the rest may run on for milliseconds meanwhile (one
    /// of them finishing a gated attempt the moment the gate opens).
    fn freeze(&self) {
        self.signal("-STOP");
        let tasks = format!("/proc/{}/task", self.child.id());
        wait_until("every thread of the executor stopped", || {
            std::fs::read_dir(&tasks)
                .expect("the executor's threads")
                .all(|task| {
                    let stat = std::fs::read_to_string(task.expect("a thread").path().join("stat"));
                    // The state follows the command's closing parenthesis: `T` is stopped.
                    stat.is_ok_and(|stat| {
                        stat.rsplit_once(") ")
                            .is_some_and(|(_, rest)| rest.starts_with('T'))
                    })
                })
        });
    }
}

impl Drop for Executor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

fn start_driver(config: DriverConfig) -> Driver {
    Driver::builder()
        .config(config)
        .start()
        .expect("driver starts")
}

fn addr(driver: &Driver) -> SocketAddr {
    driver.local_addr().expect("listening")
}

/// A `hash` job (or one of a gate's tasks, which return the same) whose checksum the test
/// computes itself.
struct HashJob {
    function: String,
    tasks: u64,
    payload: usize,
}

impl HashJob {
    fn payloads(&self) -> Vec<Bytes> {
        (0..self.tasks)
            .map(|i| Bytes::from(indexed_payload(i, self.payload)))
            .collect()
    }

    fn expected_checksum(&self) -> u64 {
        (0..self.tasks).fold(0u64, |sum, i| {
            sum.wrapping_add(fnv1a64(&indexed_payload(i, self.payload)))
        })
    }

    /// Runs the job to its end; the checksum of the results.
    fn run(&self, driver: &Driver) -> u64 {
        let handle = driver
            .submit(Job::new(self.function.clone(), self.payloads()))
            .expect("submitted");
        self.checksum(handle)
    }

    /// Runs a job of `gate`'s tasks (`function` is `gate.task()`): once `held` is true of the
    /// executors' running attempts, which the gate holds so that it stays true, calls `during`
    /// (the mid-job action), checks that nothing finished meanwhile, then opens the gate.
    /// Returns the checksum of the results.
    fn run_held(
        &self,
        driver: &Driver,
        gate: &Gate,
        mut held: impl FnMut(&ExecutorsView) -> bool,
        during: impl FnOnce(),
    ) -> u64 {
        assert_eq!(self.function, gate.task(), "a job of the gate's tasks");
        let handle = driver
            .submit(Job::new(self.function.clone(), self.payloads()))
            .expect("submitted");
        wait_until("executors holding attempts at the gate", || {
            driver.executors_view().is_ok_and(|view| held(&view))
        });
        during();
        assert_eq!(
            handle.tasks_done(),
            0,
            "nothing finished while the gate was shut"
        );
        gate.open();
        self.checksum(handle)
    }

    fn checksum(&self, handle: JobHandle) -> u64 {
        match handle.wait_timeout(DEADLINE).expect("job finishes") {
            JobOutcome::Succeeded(results) => {
                assert_eq!(results.len() as u64, self.tasks);
                results
                    .iter()
                    .fold(0u64, |sum, result| sum.wrapping_add(checksum_of(result)))
            }
            other => panic!("job did not succeed: {other:?}"),
        }
    }
}

/// The attempts `executor` is running in `view` (0 when it is not registered).
fn running(view: &ExecutorsView, executor: &str) -> u32 {
    (view.executors.iter())
        .find(|(id, _)| id == executor)
        .map_or(0, |(_, running)| *running)
}

/// Waits until the driver has launched at least `attempts` attempts (its published counters
/// may trail the job's end by a moment).
fn wait_for_launched(driver: &Driver, attempts: u64) {
    wait_until(&format!("{attempts} attempts launched"), || {
        driver.stats().launched >= attempts
    });
}

#[test]
fn jobs_across_two_and_three_executor_processes_have_the_right_checksum() {
    for executors in [2, 3] {
        let driver = start_driver(DriverConfig::default());
        let mut children: Vec<Executor> = (0..executors)
            .map(|i| Executor::start(addr(&driver), &format!("e{i}"), None))
            .collect();
        driver
            .wait_for_executors(executors, DEADLINE)
            .expect("executors register");
        let job = HashJob {
            function: "hash".into(),
            tasks: 3000,
            payload: 24,
        };
        assert_eq!(job.run(&driver), job.expected_checksum());
        driver.stop_executors(DEADLINE).expect("executors stop");
        for child in &mut children {
            assert!(
                child.wait().success(),
                "an executor stopped by the driver exits 0: {}",
                child.stderr()
            );
        }
        assert_eq!(driver.executors_lost(), 0);
    }
}

#[test]
fn an_executor_killed_with_sigkill_mid_job_loses_no_task() {
    let driver = start_driver(DriverConfig::default());
    let victim = Executor::start(addr(&driver), "victim", None);
    let _survivor = Executor::start(addr(&driver), "survivor", None);
    driver
        .wait_for_executors(2, DEADLINE)
        .expect("executors register");
    let gate = Gate::new();
    let job = HashJob {
        function: gate.task(),
        tasks: 600,
        payload: 8,
    };
    let mut lost_with_it = 0;
    let held = |view: &ExecutorsView| {
        lost_with_it = running(view, "victim");
        lost_with_it > 0 && running(view, "survivor") > 0
    };
    // Killed while it provably holds attempts (at the gate, so they cannot finish first); the
    // gate opens once the driver has declared it lost.
    let checksum = job.run_held(&driver, &gate, held, || {
        victim.signal("-KILL");
        wait_until("the victim declared lost", || driver.executors_lost() >= 1);
    });
    assert_eq!(checksum, job.expected_checksum());
    assert_eq!(driver.executors_lost(), 1);
    // The attempts the victim held ran again elsewhere.
    wait_for_launched(&driver, job.tasks + u64::from(lost_with_it));
}

#[test]
fn an_executor_that_joins_mid_job_gets_work() {
    let config = DriverConfig {
        tasks_per_core: 2,
        ..DriverConfig::default()
    };
    let driver = start_driver(config);
    let _first = Executor::start(addr(&driver), "first", None);
    driver
        .wait_for_executors(1, DEADLINE)
        .expect("first registers");
    let mut late = None;
    let gate = Gate::new();
    let job = HashJob {
        function: gate.task(),
        tasks: 300,
        payload: 8,
    };
    // The late executor starts while the first one's attempts are held at the gate (with 298
    // tasks queued behind them), and gets some of them before the gate opens.
    let held = |view: &ExecutorsView| running(view, "first") > 0;
    let checksum = job.run_held(&driver, &gate, held, || {
        late = Some(Executor::start(addr(&driver), "late", None));
        wait_until("the late executor to hold attempts", || {
            driver
                .executors_view()
                .is_ok_and(|view| running(&view, "late") > 0)
        });
    });
    assert_eq!(checksum, job.expected_checksum());
    driver.stop_executors(DEADLINE).expect("executors stop");
    let mut late = late.expect("started");
    assert!(late.wait().success());
    let stderr = late.stderr();
    let ran: u64 = stderr
        .split("ran ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no task count in the late executor's stderr: {stderr}"));
    assert!(ran > 0, "the late executor ran no task");
}

#[test]
fn a_stopped_executor_is_declared_lost_and_its_tasks_finish_elsewhere() {
    let config = DriverConfig {
        // Short enough to keep the test quick, long enough that a healthy executor on a loaded
        // machine is never silent this long.
        heartbeat_interval: Duration::from_millis(100),
        heartbeat_timeout: Duration::from_secs(2),
        ..DriverConfig::default()
    };
    let driver = start_driver(config);
    let frozen = Executor::start(addr(&driver), "frozen", None);
    let _other = Executor::start(addr(&driver), "other", None);
    driver
        .wait_for_executors(2, DEADLINE)
        .expect("executors register");
    let gate = Gate::new();
    let job = HashJob {
        function: gate.task(),
        tasks: 400,
        payload: 8,
    };
    let mut lost_with_it = 0;
    let held = |view: &ExecutorsView| {
        lost_with_it = running(view, "frozen");
        lost_with_it > 0 && running(view, "other") > 0
    };
    // Stopped while it provably holds attempts; the gate stays shut (nothing finishes, so
    // speculation has nothing to go on) until the heartbeat timeout has declared it lost.
    let checksum = job.run_held(&driver, &gate, held, || {
        frozen.freeze();
        wait_until("the stopped executor to be declared lost", || {
            driver.executors_lost() >= 1
        });
    });
    assert_eq!(checksum, job.expected_checksum());
    assert_eq!(driver.executors_lost(), 1);
    wait_for_launched(&driver, job.tasks + u64::from(lost_with_it));
    frozen.signal("-KILL");
}

#[test]
fn a_duplicate_executor_id_is_refused_and_that_executor_exits_naming_the_reason() {
    let driver = start_driver(DriverConfig::default());
    let _first = Executor::start(addr(&driver), "twin", None);
    driver
        .wait_for_executors(1, DEADLINE)
        .expect("first registers");
    let mut second = Executor::start(addr(&driver), "twin", None);
    let status = second.wait();
    assert!(!status.success());
    assert!(
        second.stderr().contains("duplicate executor id \"twin\""),
        "stderr: {}",
        second.stderr()
    );
    assert_eq!(driver.executors(), 1);
}

#[test]
fn a_wrong_or_missing_secret_is_refused() {
    let secret = Secret::new("right").expect("non-empty");
    let driver = start_driver(DriverConfig {
        secret: Some(secret),
        ..DriverConfig::default()
    });
    for (id, secret) in [("wrong", Some("wrong")), ("none", None)] {
        let mut executor = Executor::start(addr(&driver), id, secret);
        assert!(!executor.wait().success());
        assert!(
            executor.stderr().contains("bad credentials"),
            "{id}: {}",
            executor.stderr()
        );
    }
    let _good = Executor::start(addr(&driver), "good", Some("right"));
    driver
        .wait_for_executors(1, DEADLINE)
        .expect("the right secret registers");
}

/// Reads until the driver closes the connection; true if it did within the deadline.
fn closed_by_peer(stream: &mut TcpStream) -> bool {
    stream.set_read_timeout(Some(DEADLINE)).expect("timeout");
    let mut sink = [0u8; 4096];
    loop {
        match stream.read(&mut sink) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(error) if error.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

#[test]
fn garbage_oversize_and_truncated_frames_from_raw_sockets_do_not_disturb_a_job() {
    let config = DriverConfig {
        handshake_timeout: Duration::from_secs(1),
        ..DriverConfig::default()
    };
    let driver = start_driver(config);
    let _a = Executor::start(addr(&driver), "a", None);
    let _b = Executor::start(addr(&driver), "b", None);
    driver
        .wait_for_executors(2, DEADLINE)
        .expect("executors register");
    let gate = Gate::new();
    let job = HashJob {
        function: gate.task(),
        tasks: 1000,
        payload: 16,
    };
    let closed = Arc::new(AtomicU64::new(0));
    let attacker_closed = closed.clone();
    let target = addr(&driver);
    // The attack comes while both executors hold attempts at the gate.
    let held = |view: &ExecutorsView| running(view, "a") > 0 && running(view, "b") > 0;
    let checksum = job.run_held(&driver, &gate, held, move || {
        let mut hello = bytes::BytesMut::new();
        Message::hello(Role::Executor, AuthMethod::None, [9; 32])
            .encode(&mut hello, FRAME_SIZE_MAX_DEFAULT)
            .expect("fits");
        let garbage: Vec<u8> = (0..4096u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let oversize = [&(1u32 << 30).to_le_bytes()[..], &[1, 0, 0, 0]].concat();
        let truncated = [&hello[..], &[200, 0, 0, 0, 16, 0, 0, 0, 1, 2, 3]].concat();
        let unknown_kind = [&hello[..], &[0, 0, 0, 0, 0xff, 0x7f, 0, 0]].concat();
        for bytes in [garbage, oversize, truncated, unknown_kind, Vec::new()] {
            let mut stream = TcpStream::connect(target).expect("connect");
            stream.write_all(&bytes).expect("write");
            if closed_by_peer(&mut stream) {
                attacker_closed.fetch_add(1, Ordering::SeqCst);
            }
        }
    });
    assert_eq!(checksum, job.expected_checksum());
    assert_eq!(
        closed.load(Ordering::SeqCst),
        5,
        "every bad connection is closed by the driver"
    );
    assert_eq!(driver.executors_lost(), 0);
    assert_eq!(driver.executors(), 2);
}

#[test]
fn flint_local_runs_a_job_and_prints_the_checksum() {
    let output = Command::new(env!("CARGO_BIN_EXE_flint"))
        .args([
            "local",
            "--executors",
            "2",
            "--tasks",
            "2000",
            "--task",
            "hash",
            "--payload",
            "8",
            "--json",
        ])
        .output()
        .expect("run flint local");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "stdout {stdout} stderr {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let job = HashJob {
        function: "hash".into(),
        tasks: 2000,
        payload: 8,
    };
    assert!(
        stdout.contains(&format!("\"checksum\":{}", job.expected_checksum())),
        "{stdout}"
    );
    assert!(stdout.contains("\"succeeded\":2000"), "{stdout}");
}

#[test]
fn flint_local_exits_non_zero_when_tasks_fail() {
    let output = Command::new(env!("CARGO_BIN_EXE_flint"))
        .args([
            "local",
            "--executors",
            "1",
            "--tasks",
            "10",
            "--task",
            "fail:1",
            "--max-failures",
            "2",
            "--json",
        ])
        .output()
        .expect("run flint local");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(!output.status.success(), "{stdout}");
    assert!(stdout.contains("\"succeeded\":0"), "{stdout}");
}

/// A TCP relay in front of the driver: every connection it accepts gets its own to the driver,
/// bytes copied both ways, so a test can count an executor's connections and break one.
struct Relay {
    addr: SocketAddr,
    /// Each relayed connection's socket toward the driver, in accept order.
    upstream: Arc<Mutex<Vec<TcpStream>>>,
}

impl Relay {
    fn start(driver: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the relay");
        let addr = listener.local_addr().expect("relay address");
        let upstream = Arc::new(Mutex::new(Vec::new()));
        let held = upstream.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = TcpStream::connect(driver) else {
                    continue;
                };
                let (Ok(client2), Ok(server2), Ok(kept)) =
                    (client.try_clone(), server.try_clone(), server.try_clone())
                else {
                    continue;
                };
                held.lock().expect("relay table").push(kept);
                relay_one_way(client, server);
                relay_one_way(server2, client2);
            }
        });
        Relay { addr, upstream }
    }

    /// Connections relayed so far.
    fn connections(&self) -> usize {
        self.upstream.lock().expect("relay table").len()
    }

    /// Breaks the `index`-th relayed connection (the driver sees it close first).
    fn break_connection(&self, index: usize) {
        let table = self.upstream.lock().expect("relay table");
        table[index].shutdown(Shutdown::Both).expect("shutdown");
    }
}

/// Copies `from` to `to` on a thread of its own until either side ends, then closes both.
fn relay_one_way(mut from: TcpStream, mut to: TcpStream) {
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut from, &mut to);
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    });
}

#[test]
fn a_two_core_executor_runs_a_job_over_two_lanes_as_one_executor() {
    let driver = start_driver(DriverConfig::default());
    let relay = Relay::start(addr(&driver));
    let mut executor = Executor::start_with(relay.addr, "laned", None, &["--cores", "2"]);
    driver
        .wait_for_executors(1, DEADLINE)
        .expect("the executor registers");
    wait_until("lane 1 to connect", || relay.connections() == 2);
    let job = HashJob {
        function: "hash".into(),
        tasks: 3000,
        payload: 24,
    };
    assert_eq!(job.run(&driver), job.expected_checksum());
    let view = driver.observer().view(DEADLINE).expect("the driver's view");
    assert_eq!(
        view.executors.len(),
        1,
        "one executor: {:?}",
        view.executors
    );
    let laned = &view.executors[0];
    assert_eq!((laned.executor_id.as_str(), laned.cores), ("laned", 2));
    assert_eq!(
        (laned.lane_launches.len(), laned.lanes_joined),
        (2, 2),
        "{laned:?}"
    );
    assert!(
        laned.lane_launches.iter().all(|&n| n > 0),
        "both lanes got launches: {laned:?}"
    );
    assert_eq!(laned.lane_launches.iter().sum::<u64>(), 3000);
    assert_eq!(relay.connections(), 2, "two connections, no more");
    driver.stop_executors(DEADLINE).expect("executors stop");
    assert!(executor.wait().success(), "{}", executor.stderr());
    // The summary counts both lanes' attempts.
    let stderr = executor.stderr();
    let ran: u64 = stderr
        .split("ran ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no task count in the executor's stderr: {stderr}"));
    assert_eq!(ran, 3000);
    assert_eq!(driver.executors_lost(), 0);
}

#[test]
fn a_lane_whose_connection_breaks_loses_its_executor_and_the_job_finishes_elsewhere() {
    let driver = start_driver(DriverConfig::default());
    let relay = Relay::start(addr(&driver));
    let mut laned = Executor::start_with(relay.addr, "laned", None, &["--cores", "2"]);
    driver
        .wait_for_executors(1, DEADLINE)
        .expect("the laned executor registers");
    wait_until("lane 1 to connect", || relay.connections() == 2);
    let _survivor = Executor::start(addr(&driver), "survivor", None);
    driver
        .wait_for_executors(2, DEADLINE)
        .expect("the survivor registers");
    let gate = Gate::new();
    let job = HashJob {
        function: gate.task(),
        tasks: 400,
        payload: 8,
    };
    // Lane 1 breaks while it provably holds attempts (launched to it and held at the gate).
    let observer = driver.observer();
    let mut lost_with_it = 0;
    let held = |view: &ExecutorsView| {
        lost_with_it = running(view, "laned");
        let lane_1_holds = observer.view(DEADLINE).is_ok_and(|full| {
            (full.executors.iter())
                .any(|e| e.executor_id == "laned" && e.lane_launches.get(1).is_some_and(|&n| n > 0))
        });
        lane_1_holds && running(view, "survivor") > 0
    };
    // Lane 0 connected first; lane 1 is the second connection.
    let checksum = job.run_held(&driver, &gate, held, || {
        relay.break_connection(1);
        wait_until("the laned executor declared lost", || {
            driver.executors_lost() >= 1
        });
    });
    assert_eq!(checksum, job.expected_checksum());
    assert_eq!(driver.executors_lost(), 1);
    wait_for_launched(&driver, job.tasks + u64::from(lost_with_it));
    let view = driver.observer().view(DEADLINE).expect("the driver's view");
    let removed = (view.executors.iter())
        .find(|e| e.executor_id == "laned")
        .map(|e| e.removed.clone())
        .expect("the laned executor in the view");
    assert!(
        removed.contains("lane 1"),
        "the reason names the lane: {removed}"
    );
    // Fate-sharing: the whole executor exits, saying the driver went away.
    assert!(!laned.wait().success());
    assert!(
        laned.stderr().contains("the driver went away"),
        "{}",
        laned.stderr()
    );
}

/// Hedging and suspicion (issue 23) with real processes: a SIGSTOPped executor's attempts are
/// copied to the other executor long before its heartbeat timeout, it gets no new work while
/// it is silent, and it is trusted again once it speaks.
#[test]
fn a_frozen_executors_attempts_are_copied_and_it_gets_no_work_until_it_speaks() {
    // Loss takes a minute here: whatever ends before that was copied, not re-queued.
    let config = DriverConfig {
        heartbeat_interval: Duration::from_secs(10),
        heartbeat_timeout: Duration::from_secs(60),
        ..DriverConfig::default()
    };
    let driver = start_driver(config);
    // Four cores: it keeps free ones while its gated attempts are stuck on it, so that "no
    // new work" below is something the scheduler could get wrong.
    let frozen = Executor::start_with(addr(&driver), "frozen", None, &["--cores", "4"]);
    let _healthy = Executor::start(addr(&driver), "healthy", None);
    driver
        .wait_for_executors(2, DEADLINE)
        .expect("executors register");
    let job = |tasks| HashJob {
        function: "hash".into(),
        tasks,
        payload: 8,
    };
    // Four tasks held at a gate on both executors (offers go round-robin, so the healthy one
    // takes one and the frozen one three; the test waits for both rather than assume it), then
    // the frozen one stops: its attempts can only end as copies (the gate's function is new,
    // so they are copied after the cold threshold, 200 ms).
    let gate = Gate::new();
    let split = HashJob {
        function: gate.task(),
        tasks: 4,
        payload: 8,
    };
    let before = driver.stats();
    let both_hold =
        |view: &ExecutorsView| running(view, "frozen") > 0 && running(view, "healthy") > 0;
    let checksum = split.run_held(&driver, &gate, both_hold, || frozen.freeze());
    assert_eq!(checksum, split.expected_checksum());
    let after = driver.stats();
    assert_eq!(
        driver.executors_lost(),
        0,
        "finished by copies, not by a loss"
    );
    // Copied by hedging, or by Spark's speculation when the healthy executor's attempts end
    // first and set a median the stuck ones are far past.
    let copies = |stats: &Stats| stats.hedges + stats.speculative_launched;
    assert!(copies(&after) > copies(&before), "{after:?}");
    // Silent past its attempts' threshold (and 20 ms): suspected.
    wait_until("the frozen executor suspected", || {
        driver
            .executor_health()
            .is_ok_and(|h| h.suspected == ["frozen"])
    });
    // While it is silent, no new work goes to it: a launch there would stay running on it
    // (its attempts of the gated job, their kills unanswered, are all it holds). Copies of
    // the healthy executor's attempts may happen meanwhile (a busy machine preempts it past
    // the hash function's threshold), so the copies are no measure of this.
    let holds = || running(&driver.executors_view().expect("view"), "frozen");
    let stuck = holds();
    assert!(stuck < 4, "it has free cores: {stuck} of 4 held");
    for _ in 0..20 {
        let small = job(2);
        assert_eq!(small.run(&driver), small.expected_checksum());
    }
    assert_eq!(holds(), stuck, "no launch went to it");
    // Trusted again once it speaks (its reports on the attempts that lost the race).
    frozen.signal("-CONT");
    wait_until("the executor trusted again", || {
        driver
            .executor_health()
            .is_ok_and(|h| h.suspected.is_empty())
    });
    assert_eq!(driver.executors_lost(), 0);
}
