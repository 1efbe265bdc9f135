//! The standalone cluster with real processes: a `flint master`, `flint worker`s advertising
//! 127.0.0.2, 127.0.0.3 and 127.0.0.4, `flint submit`, real `kill -9`, a master restart from its
//! journal, executors killed as process trees, and (where the machine allows it) a master,
//! workers and a driver in separate network namespaces joined by veth pairs.

mod common;

use common::cluster::*;
use common::{
    free_port, holding, metrics, open_held, sample, wait_until, wait_until_held, Gate, DEADLINE,
};

use std::net::SocketAddr;
use std::process::Command;

use std::time::{Duration, Instant};

use flint_engine::standalone::AppSpec;
use flint_net::handshake::HandshakeError;
use flint_net::handshake::Secret;
use flint_net::standalone::app_client::{AppClient, AppClientConfig};
use flint_net::standalone::{BlockingClient, ClientError};
use flint_net::wire::{Message, Role};

#[test]
fn submit_runs_a_job_on_three_workers_spread_out_with_the_right_checksum() {
    let dir = scratch("basic");
    let port = free_port();
    let _master = start_master(&dir, port, &[]);
    let workers: Vec<Proc> = [
        ("w1", "127.0.0.2"),
        ("w2", "127.0.0.3"),
        ("w3", "127.0.0.4"),
    ]
    .iter()
    .map(|(id, host)| start_worker(&dir, port, id, host, 2))
    .collect();
    wait_status(port, "3 alive workers", |s| s.alive_workers() == 3);
    let mut job = submit(&dir, port, 3, 3000, "hash");
    let json = submit_succeeds(&mut job, 3000);
    assert_eq!(json_u64(&json, "executors_placed"), Some(3), "{json}");
    // Spread out: one executor per worker.
    for worker in &workers {
        assert_eq!(
            worker.stderr().matches("started executor").count(),
            1,
            "{}: {}",
            worker.name,
            worker.stderr()
        );
    }
    let snapshot = wait_status(
        port,
        "the application to finish and executors to end",
        |s| s.apps.iter().all(|(_, state)| state == "FINISHED") && s.executors.is_empty(),
    );
    assert_eq!(snapshot.apps.len(), 1);
    // The worker removes a finished application's directories.
    wait_until("work dirs cleaned up", || {
        ["w1", "w2", "w3"].iter().all(|id| {
            std::fs::read_dir(dir.join(format!("work-{id}")))
                .map(|d| d.count() == 0)
                .unwrap_or(true)
        })
    });
    // `flint status` prints the same, for people and as JSON.
    let output = Command::new(FLINT)
        .args(["status", "--master", &format!("127.0.0.1:{port}"), "--json"])
        .env("FLINT_SECRET", SECRET)
        .output()
        .expect("flint status");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{text}");
    assert!(
        text.contains("\"id\":\"w2\",\"host\":\"127.0.0.3\""),
        "{text}"
    );
    assert!(text.contains("\"state\":\"FINISHED\""), "{text}");
    let output = Command::new(FLINT)
        .args(["status", "--master", &format!("127.0.0.1:{port}")])
        .env("FLINT_SECRET", SECRET)
        .output()
        .expect("flint status");
    let table = String::from_utf8_lossy(&output.stdout);
    assert!(
        table.contains("WORKERS") && table.contains("APPLICATIONS"),
        "{table}"
    );
    assert_eq!(table.matches("ALIVE").count(), 3, "{table}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_packed_master_fills_one_worker_first_within_its_memory() {
    let dir = scratch("packed");
    let port = free_port();
    let _master = start_master(&dir, port, &["--packed"]);
    let workers: Vec<Proc> = [("w1", "127.0.0.2"), ("w2", "127.0.0.3")]
        .iter()
        .map(|(id, host)| start_worker(&dir, port, id, host, 4))
        .collect();
    wait_status(port, "2 alive workers", |s| s.alive_workers() == 2);
    let started = || -> Vec<usize> {
        workers
            .iter()
            .map(|w| w.stderr().matches("started executor").count())
            .collect()
    };
    let run = |executors: &str| {
        let mut job = Proc::start(
            &dir,
            "submit",
            &[
                "submit",
                "--master",
                &format!("127.0.0.1:{port}"),
                "--executors",
                executors,
                "--memory-mb",
                "1500",
                "--tasks",
                "500",
                "--task",
                "hash",
                "--payload",
                "8",
                "--json",
            ],
        );
        submit_succeeds(&mut job, 500);
    };
    // 2 executors: packed onto one worker (spread out would give one each).
    run("2");
    let mut first = started();
    first.sort();
    assert_eq!(first, vec![0, 2]);
    // 3 executors of 1500 MiB: a 4-core, 4096 MiB worker holds only 2, so the third goes to
    // the other worker.
    let before = started();
    run("3");
    let mut second: Vec<usize> = started()
        .iter()
        .zip(&before)
        .map(|(now, then)| now - then)
        .collect();
    second.sort();
    assert_eq!(second, vec![1, 2]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_waiting_application_gets_executors_first_come_first_served_as_cores_free_up() {
    let dir = scratch("fifo");
    let port = free_port();
    let _master = start_master(&dir, port, &[]);
    let _worker = start_worker(&dir, port, "w1", "127.0.0.2", 1);
    wait_status(port, "the worker", |s| s.alive_workers() == 1);
    // The first job holds the only core until the test opens its gate.
    let gate = Gate::new();
    let mut first = submit(&dir, port, 1, 300, &gate.task());
    wait_until("the first job to start", || {
        first.stderr().contains("running the job")
    });
    let mut second = submit(&dir, port, 1, 100, "hash");
    // The only core is taken: the second application waits.
    let snapshot = wait_status(port, "a second, waiting application", |s| s.apps.len() == 2);
    assert_eq!(
        snapshot.apps.get(1).map(|a| a.1.as_str()),
        Some("WAITING"),
        "{snapshot:?}"
    );
    assert!(first.child.try_wait().ok().flatten().is_none(), "held");
    gate.open();
    submit_succeeds(&mut first, 300);
    submit_succeeds(&mut second, 100);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_duplicate_worker_id_is_refused_with_the_reason() {
    let dir = scratch("dup");
    let port = free_port();
    let _master = start_master(&dir, port, &[]);
    let _first = start_worker(&dir, port, "twin", "127.0.0.2", 1);
    wait_status(port, "the first worker", |s| s.alive_workers() == 1);
    let mut second = start_worker(&dir, port, "twin", "127.0.0.3", 1);
    let status = second.wait();
    assert_eq!(status.code(), Some(3), "{}", second.stderr());
    assert!(
        second.stderr().contains("duplicate worker id \"twin\""),
        "{}",
        second.stderr()
    );
    let snapshot = status_now(port);
    assert_eq!(snapshot.alive_workers(), 1);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_wrong_secret_is_refused_for_workers_and_drivers() {
    let dir = scratch("secret");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut command = Command::new(FLINT);
    command.env("FLINT_SECRET", "right");
    let master = Proc::start_with(command, &dir, "master", &["master", "--listen", &listen]);
    wait_until("the master to listen", || {
        master.stderr().contains("listening on")
    });
    let mut command = Command::new(FLINT);
    command.env("FLINT_SECRET", "wrong");
    // Its work directory in the test's own (the default, under the system's temporary
    // directory, would outlive the test).
    let work = dir.join("work").to_string_lossy().into_owned();
    let mut worker = Proc::start_with(
        command,
        &dir,
        "worker",
        &[
            "worker",
            "--master",
            &listen,
            "--cores",
            "1",
            "--memory-mb",
            "1",
            "--work-dir",
            &work,
        ],
    );
    assert_eq!(worker.wait().code(), Some(3), "{}", worker.stderr());
    assert!(
        worker.stderr().contains("bad credentials"),
        "{}",
        worker.stderr()
    );
    let mut job = submit(&dir, port, 1, 10, "hash");
    assert!(!job.wait().success());
    assert!(job.stderr().contains("bad credentials"), "{}", job.stderr());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn garbage_and_misbehaving_peers_do_not_disturb_the_master() {
    use std::io::{Read, Write};
    let dir = scratch("garbage");
    let port = free_port();
    let _master = start_master(&dir, port, &[]);
    let _worker = start_worker(&dir, port, "w1", "127.0.0.2", 2);
    wait_status(port, "the worker", |s| s.alive_workers() == 1);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut hello = bytes::BytesMut::new();
    Message::hello(Role::Worker, flint_net::wire::AuthMethod::None, [7; 32])
        .encode(&mut hello, flint_net::wire::FRAME_SIZE_MAX_DEFAULT)
        .expect("fits");
    let garbage: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let oversize = [&(1u32 << 30).to_le_bytes()[..], &[1, 0, 0, 0]].concat();
    let truncated = [&hello[..], &[200, 0, 0, 0, 32, 0, 0, 0, 1, 2, 3]].concat();
    let bad_body = [
        &hello[..],
        &[4, 0, 0, 0, 32, 0, 0, 0, 0xff, 0xff, 0xff, 0xff],
    ]
    .concat();
    for bytes in [garbage, oversize, truncated, bad_body] {
        let mut stream = std::net::TcpStream::connect(addr).expect("connect");
        let _ = stream.write_all(&bytes);
        // A truncated frame then the end of the stream: the master must not wait for the rest.
        let _ = stream.shutdown(std::net::Shutdown::Write);
        stream
            .set_read_timeout(Some(DEADLINE))
            .expect("read timeout");
        let mut sink = [0u8; 4096];
        let closed = loop {
            match stream.read(&mut sink) {
                Ok(0) => break true,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break true,
                Err(_) => break false,
            }
        };
        assert!(closed, "the master closes a connection that sent garbage");
    }
    // A fake worker that registers, then reports nonsense and sends what workers may not.
    let mut fake =
        BlockingClient::connect(addr, Role::Worker, secret(), DEADLINE).expect("connect");
    fake.send(&Message::RegisterWorker {
        worker_id: "fake",
        host: "127.0.0.9",
        port: 1,
        cores: u32::MAX,
        memory_mb: u64::MAX,
    })
    .expect("register");
    fake.send(&Message::ExecutorStateChanged {
        app_id: "no-such-app",
        executor_id: "../../etc",
        state: flint_net::wire::ProcessState::Failed,
        message: "nonsense",
        exit_code: Some(-1),
    })
    .expect("report");
    wait_status(port, "the fake worker alive", |s| {
        s.worker_state("fake") == Some("ALIVE")
    });
    fake.send(&Message::UnregisterApplication { app_id: "x" })
        .expect("send");
    wait_status(port, "the fake worker removed", |s| {
        s.worker_state("fake") == Some("DEAD")
    });
    // The real worker and the master still work: a job runs.
    let mut job = submit(&dir, port, 2, 500, "hash");
    submit_succeeds(&mut job, 500);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn kill_9_of_a_worker_and_its_executors_mid_job_the_job_completes_and_the_worker_comes_back() {
    let dir = scratch("kill");
    let port = free_port();
    let _master = start_master(&dir, port, &[]);
    let mut workers: Vec<Proc> = [
        ("w1", "127.0.0.2"),
        ("w2", "127.0.0.3"),
        ("w3", "127.0.0.4"),
    ]
    .iter()
    .map(|(id, host)| start_worker(&dir, port, id, host, 2))
    .collect();
    wait_status(port, "3 alive workers", |s| s.alive_workers() == 3);
    let tasks = 1500;
    let gate = Gate::new();
    let driver_metrics = metrics_addr();
    let listen = driver_metrics.to_string();
    let extra = ["--metrics-listen", listen.as_str()];
    let mut job = submit_with(&dir, port, 3, tasks, &gate.task(), &extra);
    wait_until("the job to start", || {
        job.stderr().contains("running the job")
    });
    // Killed while its executor provably holds attempts (at the gate, so none finished); the
    // gate opens once the driver has lost it and the master has placed its replacement.
    let token = common::wait_observe_token(|| job.stderr());
    wait_until_held(driver_metrics, Some(&token), 3);
    let snapshot = wait_status(port, "an executor running on w1", |s| {
        s.running_on("w1") == 1
    });
    assert_eq!(snapshot.executors.len(), 3);
    // kill -9 the worker and its executors.
    let victims = executor_pids(&dir.join("work-w1"));
    assert_eq!(victims.len(), 1, "{victims:?}");
    workers[0].kill9();
    for pid in &victims {
        kill("-KILL", pid);
    }
    let snapshot = wait_status(port, "w1 dead", |s| s.worker_state("w1") == Some("DEAD"));
    assert_eq!(snapshot.running_on("w1"), 0);
    wait_status(port, "the replacement running", |s| {
        s.executors.iter().filter(|e| e.3 == "RUNNING").count() == 3
    });
    wait_until("the driver to lose w1's executor", || {
        sample(
            &metrics(driver_metrics, Some(&token)),
            "flint_executors_lost_total",
        ) >= Some(1.0)
    });
    open_held(&gate, driver_metrics, Some(&token));
    let json = submit_succeeds(&mut job, tasks);
    assert!(json_u64(&json, "workers_lost") >= Some(1), "{json}");
    assert!(json_u64(&json, "executors_lost") >= Some(1), "{json}");
    // The replacement went to a surviving worker.
    assert_eq!(json_u64(&json, "executors_placed"), Some(4), "{json}");
    // The worker restarts and registers again under its id.
    workers[0] = start_worker(&dir, port, "w1", "127.0.0.2", 2);
    wait_status(port, "w1 alive again", |s| {
        s.worker_state("w1") == Some("ALIVE") && s.alive_workers() == 3
    });
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_restarted_worker_kills_the_executors_its_previous_run_left_behind() {
    let dir = scratch("orphans");
    let port = free_port();
    let _master = start_master(&dir, port, &[]);
    let mut worker = start_worker_allowing(&dir, port, "w1", "127.0.0.2", 1, &["sh"]);
    wait_status(port, "the worker", |s| s.alive_workers() == 1);
    // The orphan runs until the restarted worker kills it (or the test ends and opens the
    // gate), never out of time on its own.
    let gate = Gate::new();
    let spec = AppSpec {
        name: "orphaned".into(),
        driver_addr: "127.0.0.1:1".into(),
        command: "sh".into(),
        args: vec!["-c".into(), until_open(&gate)],
        cores_per_executor: 1,
        max_cores: 1,
        ..AppSpec::default()
    };
    let client = app_client(port, spec, 1);
    wait_status(port, "the executor running", |s| s.running_on("w1") == 1);
    wait_until("the pid file", || {
        executor_pids(&dir.join("work-w1")).len() == 1
    });
    let pids = executor_pids(&dir.join("work-w1"));
    worker.kill9();
    let snapshot = wait_status(port, "w1 dead", |s| s.worker_state("w1") == Some("DEAD"));
    assert!(snapshot.executors.is_empty(), "{snapshot:?}");
    assert!(group_alive(&pids[0]), "the orphan outlives its worker");
    let _worker = start_worker_allowing(&dir, port, "w1", "127.0.0.2", 1, &["sh"]);
    wait_until("the orphan to be killed", || !group_alive(&pids[0]));
    // The application still wants its executor: it gets a new one on the restarted worker.
    wait_status(port, "a new executor", |s| {
        s.running_on("w1") == 1 && s.executors.iter().all(|e| e.1 == "1")
    });
    client.stop(DEADLINE);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_flint_executor_exits_when_its_worker_is_killed() {
    let dir = scratch("watch");
    let port = free_port();
    let _master = start_master(&dir, port, &[]);
    let mut worker = start_worker(&dir, port, "w1", "127.0.0.2", 1);
    wait_status(port, "the worker", |s| s.alive_workers() == 1);
    // The default executor (`flint executor`) for a driver in this test: once registered it
    // stays up (the driver never stops it, and it has no connect timeout to run out of) until
    // its worker dies.
    let driver = flint_net::driver::Driver::builder()
        .secret(secret())
        .start()
        .expect("the driver starts");
    let driver_addr = driver.local_addr().expect("listening").to_string();
    let spec = AppSpec {
        name: "watched".into(),
        driver_addr,
        cores_per_executor: 1,
        max_cores: 1,
        ..AppSpec::default()
    };
    let client = app_client(port, spec, 1);
    wait_status(port, "the executor running", |s| s.running_on("w1") == 1);
    wait_until("the pid file", || {
        executor_pids(&dir.join("work-w1")).len() == 1
    });
    let pids = executor_pids(&dir.join("work-w1"));
    driver
        .wait_for_executors(1, DEADLINE)
        .expect("the executor registers");
    assert!(group_alive(&pids[0]));
    worker.kill9();
    wait_until("the executor to exit by itself", || !group_alive(&pids[0]));
    wait_until("its driver to see it gone", || driver.executors_lost() == 1);
    client.stop(DEADLINE);
    let _ = std::fs::remove_dir_all(&dir);
}

/// An application whose one executor is a shell that ignores SIGTERM and runs until `gate`
/// opens: a worker must fall back to SIGKILL to end it.
fn stubborn_app(port: u16, gate: &Gate) -> AppClient {
    let spec = AppSpec {
        name: "stubborn".into(),
        driver_addr: "127.0.0.1:1".into(),
        command: "sh".into(),
        args: vec!["-c".into(), format!("trap '' TERM; {}", until_open(gate))],
        cores_per_executor: 1,
        max_cores: 1,
        ..AppSpec::default()
    };
    app_client(port, spec, 1)
}

#[test]
fn sigterm_stops_a_worker_once_its_executors_are_dead_and_a_master_without_leaving_its_token() {
    let dir = scratch("sigterm");
    let port = free_port();
    let metrics = metrics_addr().to_string();
    let mut master = start_master(&dir, port, &["--metrics-listen", &metrics]);
    let mut token_file = None;
    wait_until("the master's observe token file", || {
        token_file = common::observe_token_path(&master.stderr());
        token_file.is_some()
    });
    let token_file = std::path::PathBuf::from(token_file.unwrap_or_default());
    let token_dir = token_file.parent().expect("a directory").to_owned();
    assert!(token_file.is_file(), "{}", token_file.display());
    let mut worker = start_worker_allowing(&dir, port, "w1", "127.0.0.2", 1, &["sh"]);
    wait_status(port, "the worker", |s| s.alive_workers() == 1);
    let gate = Gate::new();
    let client = stubborn_app(port, &gate);
    wait_status(port, "the executor running", |s| s.running_on("w1") == 1);
    wait_until("the pid file", || {
        executor_pids(&dir.join("work-w1")).len() == 1
    });
    let pid = executor_pids(&dir.join("work-w1")).remove(0);

    // The worker kills its executor (SIGTERM, ignored, then SIGKILL) and leaves only once it
    // has reaped it and told the master: killed, not lost with its worker.
    assert!(kill("-TERM", &worker.child.id().to_string()));
    let status = worker.wait();
    assert!(status.success(), "{status:?}: {}", worker.stderr());
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "the worker left before its executor {pid} was reaped"
    );
    wait_until("the executor's group to die", || !group_alive(&pid));
    let mut exits = Default::default();
    wait_until("the application to hear how its executor ended", || {
        exits = client.info().exits;
        !exits.is_empty()
    });
    let exit = &exits[0];
    assert_eq!(
        exit.state,
        flint_net::wire::ProcessState::Killed,
        "{exits:?}"
    );
    assert_eq!(exit.exit_code, Some(128 + 9), "{exits:?}");

    // The master stops at once and removes the token directory it made.
    assert!(kill("-TERM", &master.child.id().to_string()));
    let status = master.wait();
    assert!(status.success(), "{status:?}: {}", master.stderr());
    assert!(!token_dir.exists(), "{} left behind", token_dir.display());
    client.stop(Duration::from_secs(1));
}

#[test]
fn a_second_signal_ends_a_stopping_worker_at_once_with_128_plus_its_number() {
    let dir = scratch("sigint-twice");
    let port = free_port();
    let _master = start_master(&dir, port, &[]);
    let mut worker = start_worker_allowing(&dir, port, "w1", "127.0.0.2", 1, &["sh"]);
    wait_status(port, "the worker", |s| s.alive_workers() == 1);
    let gate = Gate::new();
    let client = stubborn_app(port, &gate);
    wait_status(port, "the executor running", |s| s.running_on("w1") == 1);
    // The first signal starts a stop that waits a second for the executor (its SIGKILL comes
    // after the worker's --kill-timeout-ms); the second ends it at once.
    let pid = worker.child.id().to_string();
    assert!(kill("-TERM", &pid) && kill("-INT", &pid));
    let status = worker.wait();
    assert_eq!(
        status.code(),
        Some(128 + 2),
        "{status:?}: {}",
        worker.stderr()
    );
    client.stop(Duration::from_secs(1));
}

#[test]
fn a_master_restarted_from_its_state_dir_mid_job_recovers_workers_and_the_application() {
    let dir = scratch("restart");
    let state = dir.join("state");
    let state_arg = state.to_string_lossy().into_owned();
    let port = free_port();
    let mut master = start_master(&dir, port, &["--state-dir", &state_arg]);
    let _workers: Vec<Proc> = [("w1", "127.0.0.2"), ("w2", "127.0.0.3")]
        .iter()
        .map(|(id, host)| start_worker(&dir, port, id, host, 1))
        .collect();
    wait_status(port, "2 alive workers", |s| s.alive_workers() == 2);
    let tasks = 800;
    let gate = Gate::new();
    let driver_metrics = metrics_addr();
    let listen = driver_metrics.to_string();
    let extra = ["--metrics-listen", listen.as_str()];
    let mut job = submit_with(&dir, port, 2, tasks, &gate.task(), &extra);
    wait_until("the job to start", || {
        job.stderr().contains("running the job")
    });
    // The master restarts while both executors provably hold attempts (at the gate); the gate
    // opens once it has taken the workers, the application and its executors back.
    let token = common::wait_observe_token(|| job.stderr());
    wait_until_held(driver_metrics, Some(&token), 2);
    master.kill9();
    let mut master = start_master(&dir, port, &["--state-dir", &state_arg]);
    wait_status(
        port,
        "the workers, the application and its executors back",
        |s| {
            s.alive_workers() == 2
                && s.apps.iter().any(|(_, state)| state == "RUNNING")
                && s.executors.iter().filter(|e| e.3 == "RUNNING").count() == 2
        },
    );
    open_held(&gate, driver_metrics, Some(&token));
    let json = submit_succeeds(&mut job, tasks);
    // The restarted master adopted the two running executors instead of placing new ones.
    assert_eq!(json_u64(&json, "executors_placed"), Some(2), "{json}");
    // The application came back to it and unregistered normally at the end.
    let snapshot = wait_status(port, "the application finished", |s| {
        s.apps.iter().any(|(_, state)| state == "FINISHED")
    });
    assert_eq!(snapshot.alive_workers(), 2, "{snapshot:?}");
    assert!(
        master
            .stderr()
            .contains("recovering 2 workers and 1 applications"),
        "{}",
        master.stderr()
    );
    master.kill9();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_application_whose_executors_keep_failing_is_removed_with_the_reason() {
    let dir = scratch("retries");
    let port = free_port();
    let _master = start_master(&dir, port, &["--max-executor-retries", "3"]);
    let _worker = start_worker_allowing(&dir, port, "w1", "127.0.0.2", 2, &["sh"]);
    wait_status(port, "the worker", |s| s.alive_workers() == 1);
    let spec = AppSpec {
        name: "doomed".into(),
        driver_addr: "127.0.0.1:1".into(),
        command: "sh".into(),
        args: vec!["-c".into(), "exit 7".into()],
        cores_per_executor: 1,
        max_cores: 1,
        ..AppSpec::default()
    };
    let client = app_client(port, spec, 1);
    wait_until("the application to be removed", || {
        client.removed().is_some()
    });
    let reason = client.removed().unwrap_or_default();
    assert!(reason.contains("max executor retries 3"), "{reason}");
    assert!(reason.contains("exit code 7"), "{reason}");
    let snapshot = status_now(port);
    assert!(
        snapshot.apps.iter().any(|(_, state)| state == "FAILED"),
        "{snapshot:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn submit_stops_with_the_masters_reason_when_its_executors_keep_crashing() {
    let dir = scratch("crash");
    let port = free_port();
    let _master = start_master(&dir, port, &["--max-executor-retries", "3"]);
    let _worker = start_worker(&dir, port, "w1", "127.0.0.2", 1);
    wait_status(port, "the worker", |s| s.alive_workers() == 1);
    // Every task aborts its executor: the worker reports each exit as FAILED (signal 6).
    let mut job = Proc::start(
        &dir,
        "submit",
        &[
            "submit",
            "--master",
            &format!("127.0.0.1:{port}"),
            "--executors",
            "1",
            "--tasks",
            "10",
            "--task",
            "crash:1",
            "--json",
        ],
    );
    let status = job.wait();
    assert!(!status.success());
    let stderr = job.stderr();
    assert!(
        stderr.contains("the master removed the application")
            && stderr.contains("max executor retries 3"),
        "{stderr}"
    );
    assert!(stderr.contains("signal 6"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Whether a process group has a live member. The group leader counts as dead once it is a
/// zombie (an orphan's zombie waits for whoever reaps orphans here).
fn group_alive(pgid: &str) -> bool {
    let leader_zombie = std::fs::read_to_string(format!("/proc/{pgid}/stat"))
        .ok()
        .and_then(|stat| {
            stat.rsplit(')')
                .next()
                .map(|rest| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(true);
    kill("-0", &format!("-{pgid}")) && (!leader_zombie || other_member_alive(pgid))
}

/// Whether a process other than the leader is in group `pgid` (from /proc).
fn other_member_alive(pgid: &str) -> bool {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .any(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            name != pgid
                && name.bytes().all(|b| b.is_ascii_digit())
                && std::fs::read_to_string(entry.path().join("stat")).is_ok_and(|stat| {
                    let fields: Vec<&str> = stat
                        .rsplit(')')
                        .next()
                        .unwrap_or("")
                        .split_whitespace()
                        .collect();
                    // After the command: state, ppid, pgrp.
                    fields.get(2) == Some(&pgid) && fields.first() != Some(&"Z")
                })
        })
}

#[test]
fn killed_executors_lose_their_whole_process_tree_even_when_they_ignore_sigterm() {
    let dir = scratch("tree");
    let port = free_port();
    let _master = start_master(&dir, port, &[]);
    let _worker = start_worker_allowing(&dir, port, "w1", "127.0.0.2", 2, &["sh"]);
    wait_status(port, "the worker", |s| s.alive_workers() == 1);
    // Each executor is a shell that ignores SIGTERM (as do its children) with a child of its
    // own: the worker must fall back to SIGKILL for the whole group. They run until killed (or
    // the test ends and opens the gate), never out of time on their own.
    let gate = Gate::new();
    let spec = AppSpec {
        name: "stubborn".into(),
        driver_addr: "127.0.0.1:1".into(),
        command: "sh".into(),
        args: vec![
            "-c".into(),
            format!(
                "trap '' TERM; echo \"$FLINT_EXECUTOR_ID $FLINT_DRIVER_ADDR\"; ({}) & wait",
                until_open(&gate)
            ),
        ],
        cores_per_executor: 1,
        max_cores: 2,
        ..AppSpec::default()
    };
    let client = app_client(port, spec, 2);
    let snapshot = wait_status(port, "2 running executors", |s| s.running_on("w1") == 2);
    // The worker answers status too, about itself and its executors.
    let worker_addr = _worker.listen.expect("listening");
    let mut own = None;
    wait_until("the worker's own status", || {
        own = status_of(worker_addr);
        own.is_some()
    });
    let own = own.unwrap_or_default();
    assert_eq!(own.worker_state("w1"), Some("ALIVE"), "{own:?}");
    assert_eq!(own.running_on("w1"), 2, "{own:?}");
    let app = snapshot.executors[0].0.clone();
    let work = dir.join("work-w1").join(&app);
    wait_until("pid files", || {
        executor_pids(&dir.join("work-w1")).len() == 2
    });
    let pids = executor_pids(&dir.join("work-w1"));
    wait_until("the executor's stdout", || {
        std::fs::read_to_string(work.join("0").join("stdout"))
            .is_ok_and(|out| out.contains("0 127.0.0.1:1"))
    });
    // Kill one executor on request (lowering the request first, as a driver does): its group
    // dies, after the SIGKILL fallback.
    let pid0 = std::fs::read_to_string(work.join("0").join("pid"))
        .expect("pid")
        .trim()
        .to_owned();
    assert!(group_alive(&pid0));
    client.request_executors(1).expect("request");
    client
        .kill_executors(vec!["0".into()])
        .expect("kill request");
    wait_until("executor 0's process group to die", || !group_alive(&pid0));
    wait_status(port, "one executor left", |s| {
        s.executors.len() == 1 && s.executors.iter().all(|e| e.1 == "1")
    });
    // Unregistering kills the rest and cleans the application's directory.
    client.stop(DEADLINE);
    for pid in &pids {
        wait_until("every executor group to die", || !group_alive(pid));
    }
    wait_until("the application's directory removed", || !work.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// The multi-host scenario: a master, two workers and the driver, each in its own network
/// namespace on a bridge of veth pairs (10.77.0.0/24); one worker's link is cut mid-job. Runs
/// when the machine allows namespaces (root, CAP_SYS_ADMIN, `ip`), else says why it skips;
/// `ci/multihost` sets FLINT_REQUIRE_NETNS so that a skip there is a failure.
#[test]
fn multihost_in_network_namespaces_or_a_clear_skip() {
    let required = std::env::var_os("FLINT_REQUIRE_NETNS").is_some();
    match netns::probe() {
        Ok(()) => multihost(),
        Err(why) if required => panic!("FLINT_REQUIRE_NETNS is set but namespaces fail: {why}"),
        Err(why) => eprintln!(
            "SKIPPED multihost: network namespaces are not available here ({why}); ci/multihost runs it where they are"
        ),
    }
}

fn multihost() {
    let net = netns::Net::create(&["master", "w1", "w2", "driver"]).expect("namespaces");
    let dir = scratch("multihost");
    let secret = "multihost-secret";
    let master_addr = format!("{}:7077", net.ip("master"));
    let mut master_cmd = net.command("master");
    master_cmd.env("FLINT_SECRET", secret);
    let _master = Proc::start_with(
        master_cmd,
        &dir,
        "master",
        &[
            "master",
            "--listen",
            &master_addr,
            "--worker-timeout-ms",
            "2000",
            "--heartbeat-interval-ms",
            "200",
        ],
    );
    wait_until("the master to listen", || {
        _master.stderr().contains("listening on")
    });
    let mut workers = Vec::new();
    for id in ["w1", "w2"] {
        let mut command = net.command(id);
        command.env("FLINT_SECRET", secret);
        let work = dir.join(format!("work-{id}"));
        workers.push(Proc::start_with(
            command,
            &dir,
            id,
            &[
                "worker",
                "--master",
                &master_addr,
                "--id",
                id,
                "--cores",
                "2",
                "--memory-mb",
                "1024",
                "--work-dir",
                &work.to_string_lossy(),
            ],
        ));
    }
    let status_in_ns = || -> String {
        let output = net
            .command("driver")
            .args(["status", "--master", &master_addr, "--json"])
            .env("FLINT_SECRET", secret)
            .output()
            .expect("flint status");
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    wait_until("two workers registered across namespaces", || {
        status_in_ns().matches("\"state\":\"ALIVE\"").count() == 2
    });
    let status_text = status_in_ns();
    assert!(
        status_text.contains(&format!("\"host\":\"{}\"", net.ip("w1"))),
        "{status_text}"
    );
    let tasks = 1500u64;
    let gate = Gate::new();
    let task = gate.task();
    let driver_metrics: SocketAddr = format!("{}:9464", net.ip("driver")).parse().expect("addr");
    let metrics_listen = driver_metrics.to_string();
    let mut driver_cmd = net.command("driver");
    driver_cmd.env("FLINT_SECRET", secret);
    let mut job = Proc::start_with(
        driver_cmd,
        &dir,
        "submit",
        &[
            "submit",
            "--master",
            &master_addr,
            "--listen",
            &format!("{}:0", net.ip("driver")),
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
            "4",
            "--heartbeat-timeout-ms",
            "2000",
            "--json",
            "--metrics-listen",
            &metrics_listen,
        ],
    );
    wait_until("the job to start", || {
        job.stderr().contains("running the job")
    });
    // The driver's metrics, read from inside its namespace with its observe token.
    let token = common::wait_observe_token(|| job.stderr());
    let scrape = || {
        let token = token.clone();
        net.run_in("driver", move || metrics(driver_metrics, Some(&token)))
    };
    // Cut w1's link while both executors provably hold attempts (at the gate): the master times
    // w1 out and the driver loses its executor, all before the gate opens; then the job
    // finishes on w2.
    wait_until("both executors holding attempts", || holding(&scrape(), 2));
    net.cut("w1");
    let w1_dead = "{\"id\":\"w1\",\"host\":\"10.77.0.11\",\"port\":0,\"state\":\"DEAD\"";
    wait_until("the master to declare w1 dead", || {
        status_in_ns().contains(w1_dead)
    });
    wait_until("the driver to lose w1's executor", || {
        sample(&scrape(), "flint_executors_lost_total") >= Some(1.0)
    });
    let text = scrape();
    assert_eq!(
        sample(&text, "flint_tasks_succeeded_total"),
        Some(0.0),
        "{text}"
    );
    gate.open();
    let json = submit_succeeds(&mut job, tasks);
    assert!(json_u64(&json, "workers_lost") >= Some(1), "{json}");
    assert!(json_u64(&json, "executors_lost") >= Some(1), "{json}");
    let status_text = status_in_ns();
    assert!(status_text.contains(w1_dead), "{status_text}");
    // The link comes back: w1's next heartbeat reaches a master that declared it dead, which
    // drops the connection; w1 reconnects and registers again.
    net.restore("w1");
    wait_until("w1 to register again after its link came back", || {
        status_in_ns().matches("\"state\":\"ALIVE\"").count() == 2
    });
    // Now the master's link goes down: no reset reaches the workers, so they notice the silence
    // (no heartbeat acks), reconnect once the link is back, and register again.
    net.cut("master");
    wait_until("the workers to notice the master's silence", || {
        workers
            .iter()
            .all(|w| w.stderr().contains("no answer from the master"))
    });
    net.restore("master");
    wait_until("both workers to register again", || {
        workers
            .iter()
            .all(|w| w.stderr().matches("registered with the master").count() >= 2)
            && status_in_ns().matches("\"state\":\"ALIVE\"").count() == 2
    });
    // w1's executor is cut off from everything: kill it so the namespace can go.
    drop(workers);
    for id in ["w1", "w2"] {
        for pid in executor_pids(&dir.join(format!("work-{id}"))) {
            kill("-KILL", &pid);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Network namespaces joined by a bridge, through the `ip` command.
mod netns {
    use std::process::{Command, Stdio};

    fn ip(args: &[&str]) -> Result<(), String> {
        let output = Command::new("ip")
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run ip: {e}"))?;
        if output.status.success() {
            Ok(())
        } else {
            Err(format!(
                "ip {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&output.stderr).trim()
            ))
        }
    }

    /// Whether this machine lets us create namespaces and veth pairs.
    pub fn probe() -> Result<(), String> {
        let name = format!("flintprobe{}", std::process::id());
        ip(&["netns", "add", &name])?;
        let tag = std::process::id() % 10_000;
        let (a, b) = (format!("fpa{tag}"), format!("fpb{tag}"));
        let result = ip(&["netns", "exec", &name, "true"])
            .and_then(|()| ip(&["link", "add", &a, "type", "veth", "peer", "name", &b]));
        let _ = ip(&["link", "del", &a]);
        let _ = ip(&["netns", "del", &name]);
        result
    }

    /// Namespaces on one bridge; removed on drop.
    pub struct Net {
        prefix: String,
        names: Vec<String>,
        bridge: String,
    }

    impl Net {
        pub fn create(names: &[&str]) -> Result<Net, String> {
            let tag = std::process::id() % 10_000;
            let prefix = format!("fl{tag}");
            let net = Net {
                bridge: format!("{prefix}br"),
                prefix,
                names: names.iter().map(|n| (*n).to_owned()).collect(),
            };
            ip(&["link", "add", &net.bridge, "type", "bridge"])?;
            ip(&["link", "set", &net.bridge, "up"])?;
            for (index, name) in net.names.iter().enumerate() {
                let ns = net.ns(name);
                let outside = format!("{}h{index}", net.prefix);
                ip(&["netns", "add", &ns])?;
                ip(&[
                    "link", "add", &outside, "type", "veth", "peer", "name", "eth0", "netns", &ns,
                ])?;
                ip(&["link", "set", &outside, "master", &net.bridge])?;
                ip(&["link", "set", &outside, "up"])?;
                let cidr = format!("{}/24", net.ip_at(index));
                ip(&["-n", &ns, "addr", "add", &cidr, "dev", "eth0"])?;
                ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
                ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            }
            Ok(net)
        }

        fn ns(&self, name: &str) -> String {
            format!("{}{name}", self.prefix)
        }

        fn ip_at(&self, index: usize) -> String {
            format!("10.77.0.{}", index + 10)
        }

        pub fn ip(&self, name: &str) -> String {
            let index = self.names.iter().position(|n| n == name).unwrap_or(0);
            self.ip_at(index)
        }

        /// A command running `flint` inside `name`'s namespace.
        pub fn command(&self, name: &str) -> Command {
            let mut command = Command::new("ip");
            command.args(["netns", "exec", &self.ns(name), super::FLINT]);
            command
        }

        /// Takes `name`'s link down (its processes keep running, cut off).
        pub fn cut(&self, name: &str) {
            self.set_link(name, "down");
        }

        /// Runs `f` on a thread of its own inside `name`'s network namespace (the sockets it
        /// opens are that namespace's): how the test reaches what listens there.
        pub fn run_in<T: Send + 'static>(
            &self,
            name: &str,
            f: impl FnOnce() -> T + Send + 'static,
        ) -> T {
            use std::os::fd::AsRawFd;
            use std::os::raw::c_int;
            extern "C" {
                fn setns(fd: c_int, nstype: c_int) -> c_int;
            }
            const CLONE_NEWNET: c_int = 0x4000_0000;
            let path = format!("/var/run/netns/{}", self.ns(name));
            std::thread::spawn(move || {
                let ns = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
                // SAFETY: `ns` is an open descriptor of a network namespace for the whole call,
                // and setns(2) with CLONE_NEWNET moves only the calling thread: this one, ours,
                // which ends with `f`.
                let moved = unsafe { setns(ns.as_raw_fd(), CLONE_NEWNET) };
                let error = std::io::Error::last_os_error();
                assert_eq!(moved, 0, "setns {path}: {error}");
                f()
            })
            .join()
            .expect("no panic inside the namespace")
        }

        /// Brings `name`'s link back up.
        pub fn restore(&self, name: &str) {
            self.set_link(name, "up");
        }

        fn set_link(&self, name: &str, state: &str) {
            let index = self.names.iter().position(|n| n == name).unwrap_or(0);
            let outside = format!("{}h{index}", self.prefix);
            if let Err(error) = ip(&["link", "set", &outside, state]) {
                panic!("cannot set {name}'s link {state}: {error}");
            }
        }
    }

    impl Drop for Net {
        fn drop(&mut self) {
            for (index, name) in self.names.iter().enumerate() {
                let _ = ip(&["link", "del", &format!("{}h{index}", self.prefix)]);
                let _ = ip(&["netns", "del", &self.ns(name)]);
            }
            let _ = ip(&["link", "del", &self.bridge]);
        }
    }
}

/// Issue 12, item 1: a master started with no secret configured is authenticated anyway (it
/// creates a random secret, mode 0600, in its state dir and says where); a peer without it is
/// refused; and an application holding the secret still cannot make a worker run anything but
/// `flint executor` and the programs the worker allows.
#[test]
fn a_default_master_requires_its_generated_secret_and_workers_run_only_allowed_commands() {
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch("secure-default");
    let state = dir.join("state");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut command = Command::new(FLINT);
    command.env_remove("FLINT_SECRET");
    let master = Proc::start_with(
        command,
        &dir,
        "master",
        &[
            "master",
            "--listen",
            &listen,
            "--state-dir",
            &state.to_string_lossy(),
            "--max-executor-retries",
            "2",
        ],
    );
    wait_until("the master to listen", || {
        master.stderr().contains("listening on")
    });
    let secret_file = state.join("secret");
    let mode = std::fs::metadata(&secret_file)
        .expect("the master created its secret file")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    assert!(
        master.stderr().contains(&secret_file.display().to_string()),
        "{}",
        master.stderr()
    );
    let generated = Secret::from_file(&secret_file).expect("a secret");
    let addr: SocketAddr = listen.parse().expect("addr");
    // An attacker without the secret gets nowhere, whatever role it claims.
    for role in [Role::Driver, Role::Worker, Role::Client] {
        let refused = BlockingClient::connect(addr, role, None, DEADLINE).err();
        assert!(
            matches!(
                &refused,
                Some(ClientError::Handshake {
                    source: HandshakeError::Refused(reason) | HandshakeError::RefusedByPeer(reason),
                    ..
                }) if reason.contains("bad credentials")
            ),
            "{role}: {refused:?}"
        );
    }
    // A worker given the secret file registers.
    let work = dir.join("work");
    let mut command = Command::new(FLINT);
    command.env_remove("FLINT_SECRET");
    let _worker = Proc::start_with(
        command,
        &dir,
        "worker",
        &[
            "worker",
            "--master",
            &listen,
            "--id",
            "w1",
            "--cores",
            "2",
            "--memory-mb",
            "1024",
            "--work-dir",
            &work.to_string_lossy(),
            "--secret-file",
            &secret_file.to_string_lossy(),
        ],
    );
    let mut snapshot = None;
    wait_until("the worker registered", || {
        snapshot = status_with(addr, Some(generated.clone()));
        snapshot.as_ref().is_some_and(|s| s.alive_workers() == 1)
    });
    // An application (even one holding the secret) asking for a shell: refused by the worker.
    let marker = dir.join("pwned");
    let client = AppClient::start(AppClientConfig {
        master: addr,
        secret: Some(generated.clone()),
        spec: AppSpec {
            name: "shell".into(),
            driver_addr: "127.0.0.1:1".into(),
            command: "/bin/sh".into(),
            args: vec!["-c".into(), format!("touch {}", marker.display())],
            cores_per_executor: 1,
            max_cores: 1,
            ..AppSpec::default()
        },
        executors: Some(1),
        reconnect_max: Duration::from_millis(500),
    })
    .expect("app client");
    client.wait_registered(DEADLINE).expect("registered");
    wait_until("the application to be removed", || {
        client.removed().is_some()
    });
    let reason = client.removed().unwrap_or_default();
    assert!(reason.contains("is not allowed on this worker"), "{reason}");
    assert!(!marker.exists(), "the worker ran the application's shell");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 12, item 2: `flint submit` does not put the secret in the application's environment,
/// the master drops one an application sends anyway, so the journal never holds it; executors
/// still authenticate (their worker gives them its copy).
#[test]
fn the_secret_never_reaches_the_journal_and_executors_still_authenticate() {
    let dir = scratch("journal-secret");
    let state = dir.join("state");
    let state_arg = state.to_string_lossy().into_owned();
    let port = free_port();
    let _master = start_master(&dir, port, &["--state-dir", &state_arg]);
    let _worker = start_worker(&dir, port, "w1", "127.0.0.2", 2);
    wait_status(port, "the worker", |s| s.alive_workers() == 1);
    let mut job = submit(&dir, port, 1, 200, "hash");
    submit_succeeds(&mut job, 200);
    // A client that still sends a secret in the environment.
    let leaky = AppSpec {
        name: "leaky".into(),
        driver_addr: "127.0.0.1:1".into(),
        env: vec![("FLINT_SECRET".into(), "leaked-secret-value".into())],
        cores_per_executor: 1,
        max_cores: 1,
        ..AppSpec::default()
    };
    let client = app_client(port, leaky, 0);
    client.sync(DEADLINE).expect("sync");
    let mut journaled = Vec::new();
    for entry in std::fs::read_dir(&state).expect("state dir").flatten() {
        journaled.extend(std::fs::read(entry.path()).unwrap_or_default());
    }
    assert!(!journaled.is_empty(), "the master journaled nothing");
    let contains = |needle: &[u8]| journaled.windows(needle.len()).any(|w| w == needle);
    assert!(!contains(SECRET.as_bytes()), "the journal holds the secret");
    assert!(
        !contains(b"leaked-secret-value"),
        "the journal holds the secret"
    );
    assert!(contains(b"leaky"), "the journal lacks the application");
    client.stop(DEADLINE);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 12, item 3 (master): thousands of silent unauthenticated connections do not keep
/// `flint status` and `flint submit` out.
#[test]
fn silent_unauthenticated_connections_do_not_lock_people_and_drivers_out() {
    let dir = scratch("flood");
    let port = free_port();
    let _master = start_master(&dir, port, &[]);
    let _worker = start_worker(&dir, port, "w1", "127.0.0.2", 2);
    wait_status(port, "the worker", |s| s.alive_workers() == 1);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let flood: Vec<std::net::TcpStream> = (0..4100)
        .filter_map(|_| std::net::TcpStream::connect(addr).ok())
        .collect();
    assert!(flood.len() > 4000, "{} connections", flood.len());
    let (code, stdout, stderr) = flint_output(
        &["status", "--master", &addr.to_string(), "--json"],
        &[("FLINT_SECRET", SECRET)],
    );
    assert_eq!(code, Some(0), "{stdout} {stderr}");
    assert!(stdout.contains("\"id\":\"w1\""), "{stdout}");
    let mut job = submit(&dir, port, 1, 100, "hash");
    submit_succeeds(&mut job, 100);
    drop(flood);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 12, item 4: an application that sets no maximum gets the master's default cores, so
/// another application still gets executors; `flint status` says why the first one waits.
#[test]
fn an_application_without_a_maximum_cannot_take_the_whole_cluster() {
    let dir = scratch("fair");
    let port = free_port();
    let _master = start_master(&dir, port, &["--default-cores", "2"]);
    let _workers: Vec<Proc> = [("w1", "127.0.0.2"), ("w2", "127.0.0.3")]
        .iter()
        .map(|(id, host)| start_worker_allowing(&dir, port, id, host, 2, &["sh"]))
        .collect();
    wait_status(port, "2 alive workers", |s| s.alive_workers() == 2);
    // The greedy application's executors hold their cores until it stops.
    let gate = Gate::new();
    let greedy = AppClient::start(AppClientConfig {
        master: SocketAddr::from(([127, 0, 0, 1], port)),
        secret: secret(),
        spec: AppSpec {
            name: "greedy".into(),
            driver_addr: "127.0.0.1:1".into(),
            command: "sh".into(),
            args: vec!["-c".into(), until_open(&gate)],
            cores_per_executor: 1,
            max_cores: 0,
            ..AppSpec::default()
        },
        executors: None,
        reconnect_max: Duration::from_millis(500),
    })
    .expect("app client");
    let greedy_id = greedy.wait_registered(DEADLINE).expect("registered");
    wait_status(port, "the greedy application's 2 executors", |s| {
        s.executors.iter().filter(|e| e.0 == greedy_id).count() == 2
    });
    let (code, stdout, stderr) = flint_output(
        &["status", "--master", &format!("127.0.0.1:{port}"), "--json"],
        &[("FLINT_SECRET", SECRET)],
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.contains("\"waiting\":\"at the default maximum of 2 cores"),
        "{stdout}"
    );
    let mut job = submit(&dir, port, 2, 200, "hash");
    submit_succeeds(&mut job, 200);
    greedy.stop(DEADLINE);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A fake worker that registers, heartbeats, and never launches anything it is told to.
struct SilentWorker {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SilentWorker {
    fn start(port: u16, id: &'static str, cores: u32) -> SilentWorker {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let mut client =
            BlockingClient::connect(addr, Role::Worker, secret(), DEADLINE * 10).expect("connect");
        client
            .send(&Message::RegisterWorker {
                worker_id: id,
                host: "127.0.0.9",
                port: 1,
                cores,
                memory_mb: 4096,
            })
            .expect("register");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            while !stopping.load(std::sync::atomic::Ordering::Relaxed) {
                if client
                    .send(&Message::WorkerHeartbeat { worker_id: id })
                    .is_err()
                {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        SilentWorker {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for SilentWorker {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Issue 12, item 5: a worker that accepts `LaunchExecutor` and never launches does not hold
/// the executor forever: after the launch timeout the master marks it failed and places it on
/// another worker, and the job runs.
#[test]
fn an_executor_a_worker_never_launches_is_placed_elsewhere_after_the_launch_timeout() {
    let dir = scratch("launch-timeout");
    let port = free_port();
    let _master = start_master(&dir, port, &["--launch-timeout-ms", "1000"]);
    // The silent worker offers the most cores: it gets the first executor.
    let _silent = SilentWorker::start(port, "silent", 8);
    let _worker = start_worker(&dir, port, "w1", "127.0.0.2", 1);
    wait_status(port, "2 alive workers", |s| s.alive_workers() == 2);
    let mut job = submit(&dir, port, 1, 200, "hash");
    let json = submit_succeeds(&mut job, 200);
    assert_eq!(json_u64(&json, "executors_placed"), Some(2), "{json}");
    assert!(
        job.stderr().contains("did not start it within 1000 ms"),
        "{}",
        job.stderr()
    );
    let snapshot = status_now(port);
    assert_eq!(
        snapshot.worker_state("silent"),
        Some("ALIVE"),
        "{snapshot:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 12, item 6: a request no worker can fit fails at once with the reason, instead of
/// waiting the whole --wait-s.
#[test]
fn a_request_no_worker_can_fit_fails_at_once_saying_why() {
    let dir = scratch("unfit");
    let port = free_port();
    let _master = start_master(&dir, port, &[]);
    let _worker = start_worker(&dir, port, "w1", "127.0.0.2", 2);
    wait_status(port, "the worker", |s| s.alive_workers() == 1);
    let started = Instant::now();
    let mut job = Proc::start(
        &dir,
        "submit",
        &[
            "submit",
            "--master",
            &format!("127.0.0.1:{port}"),
            "--executors",
            "1",
            "--cores",
            "8",
            "--tasks",
            "10",
            "--wait-s",
            "600",
        ],
    );
    let status = job.wait();
    assert!(!status.success());
    assert!(started.elapsed() < Duration::from_secs(300));
    let stderr = job.stderr();
    assert!(
        stderr.contains("no worker can fit an executor of 8 cores")
            && stderr.contains("offers 2 cores"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 12, item 7: ids and numbers are checked when the command line is parsed (exit 2, with
/// the range in the message and in --help); nothing is created outside the work dir.
#[test]
fn bad_ids_and_out_of_range_numbers_are_refused_at_parse_time() {
    let dir = scratch("bad-values");
    let work = dir.join("deep").join("work");
    std::fs::create_dir_all(&work).expect("work dir");
    let work_arg = work.to_string_lossy().into_owned();
    let long_id = "a".repeat(65);
    let cases: Vec<Vec<&str>> = vec![
        vec![
            "worker",
            "--master",
            "127.0.0.1:1",
            "--cores",
            "1",
            "--memory-mb",
            "1",
            "--id",
            "../../x",
            "--work-dir",
            &work_arg,
        ],
        vec![
            "worker",
            "--master",
            "127.0.0.1:1",
            "--cores",
            "1",
            "--memory-mb",
            "1",
            "--id",
            &long_id,
        ],
        vec![
            "worker",
            "--master",
            "127.0.0.1:1",
            "--cores",
            "0",
            "--memory-mb",
            "1",
        ],
        vec![
            "worker",
            "--master",
            "127.0.0.1:1",
            "--cores",
            "1",
            "--memory-mb",
            "1",
            "--kill-timeout-ms",
            "18446744073709551615",
        ],
        vec!["master", "--heartbeat-interval-ms", "18446744073709551615"],
        vec!["master", "--worker-timeout-ms", "0"],
        vec!["master", "--max-executor-retries", "0"],
        vec!["master", "--default-cores", "0"],
        vec!["master", "--launch-timeout-ms", "1"],
        vec!["master", "--recovery-timeout-ms", "18446744073709551615"],
        vec![
            "submit",
            "--master",
            "127.0.0.1:1",
            "--executors",
            "1",
            "--cores",
            "4294967295",
        ],
        vec!["submit", "--master", "127.0.0.1:1", "--executors", "0"],
        vec![
            "submit",
            "--master",
            "127.0.0.1:1",
            "--executors",
            "1",
            "--wait-s",
            "0",
        ],
        vec![
            "submit",
            "--master",
            "127.0.0.1:1",
            "--executors",
            "1",
            "--memory-mb",
            "18446744073709551615",
        ],
        vec!["status", "--master", "127.0.0.1:1", "--timeout-ms", "0"],
    ];
    for args in &cases {
        let (code, _, stderr) = flint_output(args, &[("FLINT_SECRET", SECRET)]);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains("error: invalid value"),
            "{args:?}: {stderr}"
        );
    }
    // A heartbeat no shorter than the worker timeout would drop every worker.
    let (code, _, stderr) = flint_output(
        &[
            "master",
            "--worker-timeout-ms",
            "1000",
            "--heartbeat-interval-ms",
            "1000",
        ],
        &[("FLINT_SECRET", SECRET)],
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("must be below --worker-timeout-ms"),
        "{stderr}"
    );
    assert!(!dir.join("x").exists() && !dir.join("deep").join("x").exists());
    let (_, help, _) = flint_output(&["master", "--help"], &[]);
    assert!(help.contains("(10 to 60000"), "{help}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 12, item 7: a worker that cannot reach its master logs each failed attempt at info
/// with its backoff.
#[test]
fn a_worker_that_cannot_reach_its_master_logs_each_attempt_and_its_backoff() {
    let dir = scratch("unreachable");
    let port = free_port();
    let mut worker = Proc::start(
        &dir,
        "worker",
        &[
            "worker",
            "--master",
            &format!("127.0.0.1:{port}"),
            "--cores",
            "1",
            "--memory-mb",
            "1",
            "--work-dir",
            &dir.join("work").to_string_lossy(),
        ],
    );
    wait_until("three logged attempts", || {
        worker.stderr().matches("cannot reach the master").count() >= 3
    });
    let stderr = worker.stderr();
    assert!(stderr.contains("(attempt 3)"), "{stderr}");
    assert!(stderr.contains("retrying in 200 ms"), "{stderr}");
    worker.kill9();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 12, item 8: a missing or wrong secret says what to do, naming --secret-file and
/// $FLINT_SECRET, for workers, `flint submit` and `flint status`.
#[test]
fn a_missing_or_wrong_secret_says_to_use_secret_file_or_flint_secret() {
    let dir = scratch("actionable");
    let port = free_port();
    let _master = start_master(&dir, port, &[]);
    let master = format!("127.0.0.1:{port}");
    let worker = [
        "worker",
        "--master",
        &master,
        "--cores",
        "1",
        "--memory-mb",
        "1",
        "--work-dir",
    ];
    let work = dir.join("work").to_string_lossy().into_owned();
    let worker: Vec<&str> = worker.iter().copied().chain([work.as_str()]).collect();
    let submit = [
        "submit",
        "--master",
        &master,
        "--executors",
        "1",
        "--tasks",
        "1",
    ];
    let status = ["status", "--master", &master];
    for args in [&worker[..], &submit[..], &status[..]] {
        // No secret at all: refused before connecting.
        let (code, _, stderr) = flint_output(args, &[]);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains("--secret-file") && stderr.contains("$FLINT_SECRET"),
            "{args:?}: {stderr}"
        );
        // A wrong one: refused by the master, with what to do.
        let (code, _, stderr) = flint_output(args, &[("FLINT_SECRET", "wrong")]);
        assert_ne!(code, Some(0), "{args:?}: {stderr}");
        assert!(
            stderr.contains("wrong shared secret")
                && stderr.contains("--secret-file")
                && stderr.contains("$FLINT_SECRET"),
            "{args:?}: {stderr}"
        );
    }
    // --insecure against a master with a secret: told to give the secret.
    let (code, _, stderr) = flint_output(&[&status[..], &["--insecure"]].concat(), &[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("uses a shared secret") && stderr.contains("--secret-file"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 12, item 3 (master, --insecure): thousands of fake applications fill only the
/// application connections' share of the table: `flint status` and workers still get in.
#[test]
fn fake_applications_of_an_insecure_master_leave_room_for_status_and_workers() {
    let dir = scratch("fake-apps");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut command = Command::new(FLINT);
    command.env_remove("FLINT_SECRET");
    let master = Proc::start_with(
        command,
        &dir,
        "master",
        &["master", "--listen", &listen, "--insecure"],
    );
    wait_until("the master to listen", || {
        master.stderr().contains("listening on")
    });
    let addr: SocketAddr = listen.parse().expect("addr");
    let spec = AppSpec {
        name: "fake".into(),
        driver_addr: "127.0.0.1:1".into(),
        cores_per_executor: 1,
        max_cores: 1,
        ..AppSpec::default()
    };
    let mut fakes = Vec::new();
    let mut refused = 0;
    for _ in 0..3000 {
        let Ok(mut fake) = BlockingClient::connect(addr, Role::Driver, None, DEADLINE) else {
            refused += 1;
            continue;
        };
        flint_net::standalone::with_description(&spec, |app| {
            fake.send(&Message::RegisterApplication { app })
        })
        .expect("register");
        let registered = fake.next_frame().is_ok_and(|frame| {
            matches!(frame.message(), Ok(Message::RegisteredApplication { .. }))
        });
        if registered {
            fakes.push(fake);
        } else {
            refused += 1;
        }
    }
    assert!(refused > 0, "3000 application connections all held");
    assert!(fakes.len() >= 1000, "{} held", fakes.len());
    let (code, stdout, stderr) = flint_output(
        &["status", "--master", &listen, "--insecure", "--json"],
        &[],
    );
    assert_eq!(code, Some(0), "{stdout} {stderr}");
    let mut command = Command::new(FLINT);
    command.env_remove("FLINT_SECRET");
    let _worker = Proc::start_with(
        command,
        &dir,
        "worker",
        &[
            "worker",
            "--master",
            &listen,
            "--id",
            "w1",
            "--cores",
            "1",
            "--memory-mb",
            "64",
            "--insecure",
            "--work-dir",
            &dir.join("work").to_string_lossy(),
        ],
    );
    wait_until("the worker registered", || {
        status_with(addr, None).is_some_and(|s| s.worker_state("w1") == Some("ALIVE"))
    });
    drop(fakes);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 12, item 7: the master refuses a worker id that is not a plain name, from any peer.
#[test]
fn the_master_refuses_worker_ids_that_are_not_plain_names() {
    let dir = scratch("bad-worker-id");
    let port = free_port();
    let _master = start_master(&dir, port, &[]);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    for id in ["../../x", "a/b", ""] {
        let mut fake =
            BlockingClient::connect(addr, Role::Worker, secret(), DEADLINE).expect("connect");
        fake.send(&Message::RegisterWorker {
            worker_id: id,
            host: "127.0.0.9",
            port: 1,
            cores: 1,
            memory_mb: 1,
        })
        .expect("register");
        let frame = fake.next_frame().expect("an answer");
        assert!(
            matches!(frame.message(), Ok(Message::RegisterWorkerFailed { reason }) if reason.contains("worker id")),
            "{id:?}: {:?}",
            frame.message()
        );
    }
    assert_eq!(status_now(port).workers.len(), 0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The ports tests give their child processes to listen on come from below the kernel's
/// ephemeral range (none of this machine's connections can take one before the child binds it)
/// and are never handed out twice.
#[test]
fn free_ports_are_outside_the_ephemeral_range_and_distinct() {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").expect("range");
    let first: u16 = range
        .split_whitespace()
        .next()
        .expect("low")
        .parse()
        .expect("a port");
    let ports: Vec<u16> = (0..200).map(|_| common::free_port()).collect();
    let mut distinct = ports.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), ports.len(), "handed out twice");
    assert!(
        ports.iter().all(|&p| p < first),
        "{ports:?} against {first}"
    );
}
