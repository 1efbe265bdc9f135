//! Connection tables under a flood (issue 12, item 3): connections that finish the handshake as
//! clients and stay silent must not keep executors out of a driver, and an executor a full
//! driver refuses says why and tries again with backoff instead of exiting.

mod common;

use common::{unique, wait_until, DEADLINE};

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use flint_net::driver::{Driver, DriverConfig};
use flint_net::handshake::{random_nonce, Handshake};
use flint_net::wire::{FrameDecoder, Role, FRAME_SIZE_MAX_DEFAULT};

const FLINT: &str = env!("CARGO_BIN_EXE_flint");

/// A `flint` process with its stderr in a file; killed on drop.
struct Proc {
    child: Child,
    stderr: PathBuf,
    stdout: PathBuf,
}

impl Proc {
    fn start(args: &[&str]) -> Proc {
        let base =
            std::env::temp_dir().join(format!("flint-limits-{}-{}", std::process::id(), unique()));
        let (stdout, stderr) = (base.with_extension("out"), base.with_extension("err"));
        let child = Command::new(FLINT)
            .args(args)
            .env_remove("FLINT_SECRET")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout).expect("stdout"))
            .stderr(std::fs::File::create(&stderr).expect("stderr"))
            .spawn()
            .expect("spawn flint");
        Proc {
            child,
            stderr,
            stdout,
        }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().expect("try_wait")
    }

    fn wait(&mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + DEADLINE * 2;
        loop {
            if let Some(status) = self.exited() {
                return status;
            }
            assert!(Instant::now() < deadline, "did not exit: {}", self.stderr());
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.stderr);
        let _ = std::fs::remove_file(&self.stdout);
    }
}

/// Connects to a driver without a secret and completes the handshake as a client; the stream,
/// silent from then on.
fn client_handshake(addr: SocketAddr) -> Option<TcpStream> {
    let mut stream = TcpStream::connect(addr).ok()?;
    stream.set_read_timeout(Some(DEADLINE)).ok()?;
    let mut out = BytesMut::new();
    let nonce = random_nonce().ok()?;
    let mut handshake = Handshake::connect(Role::Client, None, nonce, &[Role::Driver], &mut out);
    stream.write_all(&out).ok()?;
    let mut decoder = FrameDecoder::new(FRAME_SIZE_MAX_DEFAULT);
    loop {
        if let Some(frame) = decoder.next_frame().ok()? {
            let mut reply = BytesMut::new();
            let step = handshake.on_frame(frame.kind(), frame.body(), &mut reply);
            stream.write_all(&reply).ok()?;
            match step {
                Ok(Some(_)) => return Some(stream),
                Ok(None) => continue,
                Err(_) => return None,
            }
        }
        let mut buf = [0u8; 4096];
        let n = stream.read(&mut buf).ok()?;
        if n == 0 {
            return None;
        }
        decoder.extend_from_slice(&buf[..n]);
    }
}

#[test]
fn silent_clients_do_not_keep_executors_out_of_a_driver() {
    let port = common::free_port();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut driver = Proc::start(&[
        "driver",
        "--listen",
        &addr.to_string(),
        "--executors",
        "2",
        "--tasks",
        "200",
        "--task",
        "hash",
        "--payload",
        "8",
        "--json",
    ]);
    wait_until("the driver to listen", || TcpStream::connect(addr).is_ok());
    let flood: Vec<TcpStream> = (0..5000).filter_map(|_| client_handshake(addr)).collect();
    assert_eq!(flood.len(), 5000, "client handshakes");
    let _executors: Vec<Proc> = ["e1", "e2"]
        .iter()
        .map(|id| Proc::start(&["executor", "--driver", &addr.to_string(), "--id", id]))
        .collect();
    let status = driver.wait();
    assert!(status.success(), "{}", driver.stderr());
    let stdout = std::fs::read_to_string(&driver.stdout).unwrap_or_default();
    assert!(stdout.contains("\"succeeded\":200"), "{stdout}");
    drop(flood);
}

/// A driver whose connection table holds `connections_max` connections, and its address.
fn driver_with_table(connections_max: usize) -> (Driver, SocketAddr) {
    let driver = Driver::builder()
        .config(DriverConfig {
            connections_max,
            ..DriverConfig::default()
        })
        .start()
        .expect("driver");
    let addr = driver.local_addr().expect("address");
    (driver, addr)
}

#[test]
fn an_executor_refused_by_a_full_driver_says_why_and_retries_with_backoff() {
    let (driver, addr) = driver_with_table(1);
    let mut first = Proc::start(&["executor", "--driver", &addr.to_string(), "--id", "first"]);
    driver
        .wait_for_executors(1, DEADLINE)
        .expect("the first executor");
    let mut second = Proc::start(&[
        "executor",
        "--driver",
        &addr.to_string(),
        "--id",
        "second",
        "--connect-timeout-s",
        "60",
    ]);
    wait_until("the second executor to be refused and retry", || {
        second.stderr().matches("connection table full").count() >= 2
    });
    assert!(second.exited().is_none(), "{}", second.stderr());
    assert!(
        second.stderr().contains("retrying in"),
        "{}",
        second.stderr()
    );
    // Room again: the second gets in.
    let _ = first.child.kill();
    let _ = first.child.wait();
    wait_until("the second executor to register", || {
        driver.executors_view().is_ok_and(|view| {
            view.executors
                .iter()
                .map(|(id, _)| id.as_str())
                .collect::<Vec<_>>()
                == ["second"]
        })
    });
}

/// A driver whose table is full of one executor's lanes refuses a newcomer with the reason
/// (it retries), and keeps the laned executor whole.
#[test]
fn a_driver_full_of_lanes_refuses_a_newcomer_saying_why() {
    let (driver, addr) = driver_with_table(2);
    let laned = ["executor", "--driver", &addr.to_string(), "--id", "laned"];
    let _laned = Proc::start(&[&laned[..], &["--cores", "2"]].concat());
    let observer = driver.observer();
    wait_until("both lanes to join", || {
        observer
            .view(DEADLINE)
            .is_ok_and(|view| view.executors.len() == 1 && view.executors[0].lanes_joined == 2)
    });
    let mut newcomer = Proc::start(&[
        "executor",
        "--driver",
        &addr.to_string(),
        "--id",
        "newcomer",
        "--connect-timeout-s",
        "60",
    ]);
    wait_until("the newcomer to be refused and retry", || {
        newcomer.stderr().matches("connection table full").count() >= 2
    });
    assert!(newcomer.exited().is_none(), "{}", newcomer.stderr());
    let view = observer.view(DEADLINE).expect("view");
    assert_eq!(view.executors.len(), 1, "{:?}", view.executors);
    assert_eq!(
        view.executors[0].lanes_joined, 2,
        "the laned executor is whole"
    );
    assert_eq!(driver.executors_lost(), 0);
}

/// A lane the full driver has no room for is left out: the executor runs on lane 0 (its two
/// cores still busy through the pool) rather than leave and come back in a loop.
#[test]
fn a_lane_a_full_driver_has_no_room_for_is_left_out_and_the_executor_runs_on() {
    let (driver, addr) = driver_with_table(1);
    let laned = ["executor", "--driver", &addr.to_string(), "--id", "laned"];
    let mut laned = Proc::start(&[&laned[..], &["--cores", "2"]].concat());
    wait_until("lane 1 to be left out", || {
        laned.stderr().contains("lane left out")
    });
    let job = flint_net::job::Job::new("echo", vec![bytes::Bytes::from("x"); 100]);
    let handle = driver.submit(job).expect("submitted");
    let outcome = handle.wait_timeout(DEADLINE).expect("the job ends");
    assert!(
        matches!(outcome, flint_net::job::JobOutcome::Succeeded(ref r) if r.len() == 100),
        "{outcome:?}"
    );
    let view = driver.observer().view(DEADLINE).expect("view");
    assert_eq!(view.executors.len(), 1, "{:?}", view.executors);
    assert_eq!(view.executors[0].lanes_joined, 1);
    assert_eq!(
        view.executors[0].lane_launches[1], 0,
        "nothing for the lane left out"
    );
    assert_eq!((view.executors_registered, driver.executors_lost()), (1, 0));
    assert!(laned.exited().is_none(), "{}", laned.stderr());
}
