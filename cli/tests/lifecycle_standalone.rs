//! The executor lifecycle through a standalone master: `flint submit` mirrors the master's
//! executor states into the snapshot store; an executor killed with `kill -9` mid-job is
//! removed from the scheduler by the lifecycle handler, the master replaces it, and the job
//! completes with the right checksum.

mod common;

use common::{free_port, open_held, unique, wait_until, wait_until_held, Gate, DEADLINE};

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};

use std::time::{Duration, Instant};

use flint_cli::summary::indexed_payload;
use flint_engine::functions::fnv1a64;

/// The cluster's shared secret (every process gets it as $FLINT_SECRET; the driver's metrics
/// take the observe token it prints the file of).
const SECRET: &str = "lifecycle-standalone-secret";

/// A `flint` process with stdout and stderr in files; killed on drop.
struct Proc {
    child: Child,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl Proc {
    fn start(dir: &Path, name: &str, args: &[&str]) -> Proc {
        let stdout = dir.join(format!("{name}.out"));
        let stderr = dir.join(format!("{name}.err"));
        let child = Command::new(env!("CARGO_BIN_EXE_flint"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout).expect("stdout file"))
            .stderr(std::fs::File::create(&stderr).expect("stderr file"))
            .env("FLINT_SECRET", SECRET)
            .spawn()
            .expect("spawn flint");
        Proc {
            child,
            stdout,
            stderr,
        }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    fn wait(&mut self) -> ExitStatus {
        let deadline = Instant::now() + DEADLINE;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "did not exit; stderr: {}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Pids of the executors a worker started (the `pid` files in its work dir).
fn executor_pids(work: &Path) -> Vec<String> {
    let mut pids = Vec::new();
    for app in std::fs::read_dir(work).into_iter().flatten().flatten() {
        for executor in std::fs::read_dir(app.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            if let Ok(pid) = std::fs::read_to_string(executor.path().join("pid")) {
                pids.push(pid.trim().to_owned());
            }
        }
    }
    pids
}

fn field(json: &str, name: &str) -> u64 {
    let key = format!("\"{name}\":");
    let start = json
        .find(&key)
        .unwrap_or_else(|| panic!("no {name} in {json}"))
        + key.len();
    json[start..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .unwrap_or_else(|_| panic!("{name} is not a number in {json}"))
}

#[test]
fn submit_an_executor_killed_mid_job_is_removed_replaced_and_the_checksum_is_right() {
    let dir = std::env::temp_dir().join(format!(
        "flint-lifecycle-sa-{}-{}",
        std::process::id(),
        unique()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let _master = Proc::start(
        &dir,
        "master",
        &[
            "master",
            "--listen",
            &listen,
            "--worker-timeout-ms",
            "2000",
            "--heartbeat-interval-ms",
            "200",
        ],
    );
    let addr: SocketAddr = listen.parse().expect("addr");
    wait_until("the master", || std::net::TcpStream::connect(addr).is_ok());
    let work = dir.join("work");
    let worker_listen = format!("127.0.0.1:{}", free_port());
    let _worker = Proc::start(
        &dir,
        "worker",
        &[
            "worker",
            "--master",
            &listen,
            "--id",
            "w1",
            "--cores",
            "3",
            "--memory-mb",
            "4096",
            "--listen",
            &worker_listen,
            "--work-dir",
            &work.to_string_lossy(),
        ],
    );
    let tasks = 1200u64;
    let gate = Gate::new();
    let task = gate.task();
    let metrics_addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let metrics_listen = metrics_addr.to_string();
    let mut submit = Proc::start(
        &dir,
        "submit",
        &[
            "submit",
            "--master",
            &listen,
            "--executors",
            "2",
            "--cores",
            "1",
            "--tasks",
            &tasks.to_string(),
            "--task",
            &task,
            "--payload",
            "8",
            "--tasks-per-core",
            "2",
            "--wait-s",
            "30",
            "--json",
            "--executor-events",
            "--metrics-listen",
            &metrics_listen,
        ],
    );
    // Both executors seen running by the lifecycle handler, and holding attempts at the gate:
    // the victim is killed mid-job by construction, and the gate opens once its replacement
    // runs.
    wait_until("the job to start", || {
        let stderr = submit.stderr();
        stderr.contains("running the job")
            && stderr.contains("executor 0 running")
            && stderr.contains("executor 1 running")
    });
    let token = common::wait_observe_token(|| submit.stderr());
    wait_until_held(metrics_addr, Some(&token), 2);
    let pids = executor_pids(&work);
    let victim = pids.first().expect("an executor pid").clone();
    let killed = Command::new("kill")
        .args(["-9", &victim])
        .status()
        .is_ok_and(|s| s.success());
    assert!(killed, "kill -9 {victim}");
    let deadline = Instant::now() + DEADLINE;
    while !submit
        .stderr()
        .contains("removed: executor exited with code 137 (caused by app: false)")
    {
        assert!(
            Instant::now() < deadline,
            "the lifecycle handler did not remove the executor; pids {pids:?}; stderr: {}",
            submit.stderr()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    wait_until("the replacement running", || {
        submit.stderr().contains("executor 2 running")
    });
    open_held(&gate, metrics_addr, Some(&token));
    let status = submit.wait();
    let stdout = std::fs::read_to_string(&submit.stdout).unwrap_or_default();
    assert!(
        status.success(),
        "stdout {stdout} stderr {}",
        submit.stderr()
    );
    let expected = (0..tasks).fold(0u64, |sum, i| {
        sum.wrapping_add(fnv1a64(&indexed_payload(i, 8)))
    });
    assert_eq!(field(&stdout, "checksum"), expected, "{stdout}");
    assert_eq!(field(&stdout, "succeeded"), tasks, "{stdout}");
    assert!(field(&stdout, "executors_removed") >= 1, "{stdout}");
    assert!(
        field(&stdout, "executors_placed") >= 3,
        "replaced: {stdout}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn submit_with_max_executors_grows_under_a_backlog_and_releases_idle_executors() {
    let dir = std::env::temp_dir().join(format!(
        "flint-lifecycle-sa-dyn-{}-{}",
        std::process::id(),
        unique()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let _master = Proc::start(
        &dir,
        "master",
        &[
            "master",
            "--listen",
            &listen,
            "--worker-timeout-ms",
            "2000",
            "--heartbeat-interval-ms",
            "200",
        ],
    );
    let addr: SocketAddr = listen.parse().expect("addr");
    wait_until("the master", || std::net::TcpStream::connect(addr).is_ok());
    let worker_listen = format!("127.0.0.1:{}", free_port());
    let _worker = Proc::start(
        &dir,
        "worker",
        &[
            "worker",
            "--master",
            &listen,
            "--id",
            "w1",
            "--cores",
            "4",
            "--memory-mb",
            "4096",
            "--listen",
            &worker_listen,
            "--work-dir",
            &dir.join("work").to_string_lossy(),
        ],
    );
    // One task slot per executor: 300 tasks held at a gate ask for the maximum of 3, for as
    // long as the test keeps it shut.
    let gate = Gate::new();
    let task = gate.task();
    let metrics_addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let metrics_listen = metrics_addr.to_string();
    let mut submit = Proc::start(
        &dir,
        "submit",
        &[
            "submit",
            "--master",
            &listen,
            "--executors",
            "1",
            "--max-executors",
            "3",
            "--idle-timeout-ms",
            "300",
            "--idle-wait-ms",
            "15000",
            "--cores",
            "1",
            "--tasks",
            "300",
            "--task",
            &task,
            "--payload",
            "8",
            "--tasks-per-core",
            "1",
            "--wait-s",
            "30",
            "--json",
            "--executor-events",
            "--metrics-listen",
            &metrics_listen,
        ],
    );
    let token = common::wait_observe_token(|| submit.stderr());
    wait_until_held(metrics_addr, Some(&token), 3);
    open_held(&gate, metrics_addr, Some(&token));
    let status = submit.wait();
    let stdout = std::fs::read_to_string(&submit.stdout).unwrap_or_default();
    assert!(
        status.success(),
        "stdout {stdout} stderr {}",
        submit.stderr()
    );
    assert_eq!(field(&stdout, "succeeded"), 300, "{stdout}");
    let expected = (0..300).fold(0u64, |sum, i| {
        sum.wrapping_add(fnv1a64(&indexed_payload(i, 8)))
    });
    assert_eq!(field(&stdout, "checksum"), expected, "{stdout}");
    assert_eq!(
        field(&stdout, "executors_peak"),
        3,
        "grew to the maximum, no further: {stdout}"
    );
    assert!(field(&stdout, "executors_released") >= 1, "{stdout}");
    assert_eq!(
        field(&stdout, "executors_end"),
        1,
        "did not shrink: {stdout}\n{}",
        submit.stderr()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
