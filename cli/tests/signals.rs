//! The commands that run a job (`flint driver`, `flint local`, `flint submit`) stopped by SIGTERM
//! or SIGINT, mid-job or still waiting: the job is cancelled, the executors stopped, a generated
//! observe token's directory removed, and the exit code is 128 + the signal's number. (The
//! master's and worker's stops are in `standalone.rs`.)

mod common;

use common::cluster::*;
use common::{
    free_port, observe_token_path, wait_observe_token, wait_until, wait_until_held, Gate,
};

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Whether process `pid` runs (exists and is no zombie).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z'))
    })
}

/// The processes whose parent is `parent`.
fn children(parent: u32) -> Vec<u32> {
    let parent = parent.to_string();
    let pids = std::fs::read_dir("/proc").into_iter().flatten().flatten();
    pids.filter_map(|entry| {
        let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
        // After the command: state, then the parent's pid.
        let (_, rest) = stat.rsplit_once(") ")?;
        (rest.split(' ').nth(1)? == parent).then_some(pid)
    })
    .collect()
}

/// The directory of the observe token whose file `proc` printed.
fn token_dir(proc: &Proc) -> PathBuf {
    let mut file = None;
    wait_until("the observe token's file", || {
        file = observe_token_path(&proc.stderr());
        file.is_some()
    });
    let file = PathBuf::from(file.unwrap_or_default());
    assert!(file.is_file(), "{}", file.display());
    file.parent().map(Path::to_owned).expect("a directory")
}

#[test]
fn sigterm_cancels_a_drivers_job_stops_its_executor_and_removes_its_token() {
    let dir = scratch("driver-sigterm");
    let listen = format!("127.0.0.1:{}", free_port());
    let metrics = metrics_addr();
    let gate = Gate::new();
    let task = gate.task();
    let metrics_arg = metrics.to_string();
    let args = [
        "driver",
        "--listen",
        &listen,
        "--executors",
        "1",
        "--tasks",
        "1000",
        "--task",
        &task,
        "--metrics-listen",
        &metrics_arg,
    ];
    let mut driver = Proc::start(&dir, "driver", &args);
    let mut executor = Proc::start(&dir, "executor", &["executor", "--driver", &listen]);
    let token_dir = token_dir(&driver);
    let token = wait_observe_token(|| driver.stderr());
    wait_until_held(metrics, Some(&token), 1);

    assert!(kill("-TERM", &driver.child.id().to_string()));
    let status = driver.wait();
    assert_eq!(status.code(), Some(128 + 15), "{}", driver.stderr());
    assert!(!token_dir.exists(), "{} left behind", token_dir.display());
    // The driver stopped its executor before leaving: it exits cleanly, not lost.
    let status = executor.wait();
    assert!(status.success(), "{status:?}: {}", executor.stderr());
}

/// `flint local` (run by `command`) with two executors holding a job until `gate` opens: the
/// process and its executors' pids (the gate must live as long as the job should hold).
fn local_holding_a_job(dir: &Path, command: Command, gate: &Gate) -> (Proc, Vec<u32>) {
    let metrics = metrics_addr();
    let task = gate.task();
    let metrics_arg = metrics.to_string();
    let args = [
        "local",
        "--executors",
        "2",
        "--tasks",
        "1000",
        "--task",
        &task,
        "--metrics-listen",
        &metrics_arg,
    ];
    let local = Proc::start_with(command, dir, "local", &args);
    // Local mode serves its metrics on loopback without a token.
    wait_until_held(metrics, None, 2);
    let executors = children(local.child.id());
    assert_eq!(executors.len(), 2, "{executors:?}");
    (local, executors)
}

/// `local` exits as SIGINT's 130, and `executors` end.
fn ends_by_sigint(mut local: Proc, executors: Vec<u32>) {
    let status = local.wait();
    assert_eq!(status.code(), Some(128 + 2), "{}", local.stderr());
    for pid in executors {
        wait_until("the executor to end", || !alive(pid));
    }
}

#[test]
fn sigint_cancels_a_local_job_and_leaves_no_executor_behind() {
    let dir = scratch("local-sigint");
    let gate = Gate::new();
    let (local, executors) = local_holding_a_job(&dir, Command::new(FLINT), &gate);
    assert!(kill("-INT", &local.child.id().to_string()));
    ends_by_sigint(local, executors);
}

/// The process group of process `pid`.
fn process_group(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command: state, parent, process group.
    stat.rsplit_once(") ")?.1.split(' ').nth(2)?.parse().ok()
}

#[test]
fn ctrl_c_at_a_terminal_reaches_flint_local_alone_and_it_stops_its_executors() {
    let dir = scratch("local-ctrl-c");
    let gate = Gate::new();
    // A terminal runs it as its foreground group, and Ctrl-C signals the whole group.
    let mut command = Command::new(FLINT);
    command.process_group(0);
    let (local, executors) = local_holding_a_job(&dir, command, &gate);
    let group = local.child.id();
    // The executors are in groups of their own: the group's SIGINT does not kill them
    // under the driver (which then also replaced them while it stopped).
    for &pid in &executors {
        let theirs = process_group(pid).expect("a live executor's group");
        assert_ne!(theirs, group, "executor {pid} in the driver's group");
    }
    assert!(kill("-INT", &format!("-{group}")));
    ends_by_sigint(local, executors);
}

#[test]
fn sigterm_ends_a_submit_still_waiting_for_its_master_to_register_it() {
    let dir = scratch("submit-sigterm");
    // Nothing listens there: the application client retries, never registered.
    let master = format!("127.0.0.1:{}", free_port());
    let listen = format!("127.0.0.1:{}", free_port());
    let args = [
        "submit",
        "--master",
        &master,
        "--listen",
        &listen,
        "--executors",
        "1",
        "--tasks",
        "10",
        "--wait-s",
        "86400",
    ];
    let mut submit = Proc::start(&dir, "submit", &args);
    // Its driver listens before it waits for the master (and after it catches the signals).
    wait_until("the submit's driver to listen", || {
        std::net::TcpStream::connect(&listen).is_ok()
    });
    assert!(kill("-TERM", &submit.child.id().to_string()));
    let status = submit.wait();
    assert_eq!(status.code(), Some(128 + 15), "{}", submit.stderr());
}
