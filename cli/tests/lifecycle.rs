//! Executor lifecycle with real processes: `flint local` keeps its executors at a target
//! (replacing ones killed with `kill -9`), follows the backlog with `--dynamic`, and stops the
//! application when executors keep failing.

mod common;

use common::{
    free_port, open_held, unique, wait_until, wait_until_held, wait_until_or, Gate, DEADLINE,
};

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};

use std::time::{Duration, Instant};

use flint_cli::summary::indexed_payload;
use flint_engine::functions::fnv1a64;

/// A `flint local` run whose stdout and stderr go to files the test reads while it runs.
struct FlintLocal {
    child: Child,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl FlintLocal {
    fn start(args: &[&str]) -> FlintLocal {
        let base = std::env::temp_dir().join(format!(
            "flint-lifecycle-{}-{}",
            std::process::id(),
            unique()
        ));
        let stdout = base.with_extension("out");
        let stderr = base.with_extension("err");
        let child = Command::new(env!("CARGO_BIN_EXE_flint"))
            .arg("local")
            .args(args)
            .args(["--json", "--executor-events"])
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout).expect("stdout file"))
            .stderr(std::fs::File::create(&stderr).expect("stderr file"))
            .env_remove("FLINT_SECRET")
            .spawn()
            .expect("spawn flint local");
        FlintLocal {
            child,
            stdout,
            stderr,
        }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Waits for a stderr line containing `text`; returns it.
    fn wait_for_line(&mut self, text: &str) -> String {
        let deadline = Instant::now() + DEADLINE;
        loop {
            if let Some(line) = self.stderr().lines().find(|l| l.contains(text)) {
                return line.to_owned();
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "flint local exited ({status}) before {text:?}; stderr:\n{}",
                    self.stderr()
                );
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {text:?}; stderr:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The pid in "executor NAME started (pid PID)".
    fn pid_of(&mut self, name: &str) -> u32 {
        let line = self.wait_for_line(&format!("executor {name} started (pid "));
        line.rsplit("(pid ")
            .next()
            .and_then(|rest| rest.trim_end_matches(')').parse().ok())
            .unwrap_or_else(|| panic!("no pid in {line:?}"))
    }

    /// Waits for the run to end: its status, stdout and stderr.
    fn finish(&mut self) -> (ExitStatus, String, String) {
        let deadline = Instant::now() + DEADLINE;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "flint local did not finish; stderr:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(5));
        };
        let stdout = std::fs::read_to_string(&self.stdout).unwrap_or_default();
        (status, stdout, self.stderr())
    }
}

impl Drop for FlintLocal {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.stdout);
        let _ = std::fs::remove_file(&self.stderr);
    }
}

/// A number field of the one-line JSON summary.
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

fn kill_9(pid: u32) {
    let status = Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill -9 {pid} failed");
}

/// A metrics address for `flint local --metrics-listen` (it serves loopback without a token).
fn metrics_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], free_port()))
}

fn expected_checksum(tasks: u64, payload: usize) -> u64 {
    (0..tasks).fold(0u64, |sum, i| {
        sum.wrapping_add(fnv1a64(&indexed_payload(i, payload)))
    })
}

#[test]
fn dynamic_allocation_grows_under_a_backlog_and_shrinks_when_idle() {
    // One task slot per executor: 300 tasks held at a gate are a backlog of 300 executors'
    // worth for as long as the test keeps it shut, so the target goes to the maximum; once the
    // gate opens and the job is done, all but the minimum go idle and are released after
    // 300 ms.
    let gate = Gate::new();
    let task = gate.task();
    let addr = metrics_addr();
    let listen = addr.to_string();
    let mut run = FlintLocal::start(&[
        "--dynamic",
        "--min-executors",
        "1",
        "--max-executors",
        "4",
        "--cores",
        "1",
        "--tasks-per-core",
        "1",
        "--idle-timeout-ms",
        "300",
        "--batch-delay-ms",
        "100",
        "--idle-wait-ms",
        "15000",
        "--tasks",
        "300",
        "--task",
        &task,
        "--payload",
        "8",
        "--metrics-listen",
        &listen,
    ]);
    // Grown to the maximum while the backlog is held, each executor holding its one attempt.
    wait_until_held(addr, None, 4);
    open_held(&gate, addr, None);
    let (status, stdout, stderr) = run.finish();
    assert!(status.success(), "stdout {stdout} stderr {stderr}");
    assert_eq!(field(&stdout, "succeeded"), 300, "{stdout}");
    assert_eq!(
        field(&stdout, "checksum"),
        expected_checksum(300, 8),
        "{stdout}"
    );
    assert_eq!(
        field(&stdout, "executors_peak"),
        4,
        "grew to the maximum, no further: {stdout}"
    );
    assert!(field(&stdout, "executors_started") >= 4, "{stdout}");
    assert_eq!(
        field(&stdout, "executors_end"),
        1,
        "did not shrink: {stdout}\n{stderr}"
    );
    assert!(field(&stdout, "executors_deleted") >= 1, "{stdout}");
    assert_eq!(field(&stdout, "executors_failed"), 0, "{stdout}\n{stderr}");
    assert!(
        stderr.contains("deleted (stopped by the driver)"),
        "{stderr}"
    );
    // Started with the minimum: the first executor registered before a second was started.
    let first_registered = stderr.find("executor local-0 registered").expect("local-0");
    let second_started = stderr.find("executor local-1 started").expect("local-1");
    assert!(first_registered < second_started, "{stderr}");
}

#[test]
fn executors_killed_mid_job_are_replaced_and_the_checksum_is_right() {
    let tasks = 1200;
    let gate = Gate::new();
    let task = gate.task();
    let addr = metrics_addr();
    let listen = addr.to_string();
    let mut run = FlintLocal::start(&[
        "--executors",
        "2",
        "--tasks-per-core",
        "2",
        "--tasks",
        "1200",
        "--task",
        &task,
        "--payload",
        "8",
        "--metrics-listen",
        &listen,
    ]);
    let first = run.pid_of("local-0");
    let second = run.pid_of("local-1");
    // Both killed while they provably hold attempts (at the gate, so none finished); the gate
    // opens once both replacements registered.
    wait_until_held(addr, None, 2);
    kill_9(first);
    run.wait_for_line("executor local-0 exited: failed (code 137");
    run.wait_for_line("executor local-2 registered");
    kill_9(second);
    run.wait_for_line("executor local-1 exited: failed (code 137");
    run.wait_for_line("executor local-3 registered");
    open_held(&gate, addr, None);
    let (status, stdout, stderr) = run.finish();
    assert!(status.success(), "stdout {stdout} stderr {stderr}");
    assert_eq!(field(&stdout, "succeeded"), tasks, "{stdout}");
    assert_eq!(
        field(&stdout, "checksum"),
        expected_checksum(tasks, 8),
        "{stdout}"
    );
    assert_eq!(field(&stdout, "executors_started"), 4, "{stdout}\n{stderr}");
    assert_eq!(field(&stdout, "executors_failed"), 2, "{stdout}");
    assert_eq!(field(&stdout, "executors_lost"), 2, "{stdout}");
    assert_eq!(
        field(&stdout, "executors_end"),
        2,
        "back at the target: {stdout}"
    );
}

#[test]
fn executors_that_keep_failing_stop_the_application_with_an_error() {
    // Every task aborts its executor: each replacement dies too, until the limit.
    let mut run = FlintLocal::start(&[
        "--executors",
        "1",
        "--max-executor-failures",
        "2",
        "--batch-delay-ms",
        "50",
        "--tasks",
        "100",
        "--task",
        "crash:1",
    ]);
    let (status, stdout, stderr) = run.finish();
    assert_eq!(status.code(), Some(2), "stdout {stdout} stderr {stderr}");
    assert!(
        stderr.contains("flint: 3 executors failed (more than the 2 allowed)"),
        "{stderr}"
    );
    assert!(
        stderr.contains("executor local-2 exited: failed"),
        "{stderr}"
    );
}

#[test]
fn dynamic_allocation_from_zero_starts_executors_for_the_backlog_and_scales_back_to_zero() {
    let mut run = FlintLocal::start(&[
        "--dynamic",
        "--min-executors",
        "0",
        "--max-executors",
        "2",
        "--tasks-per-core",
        "1",
        "--idle-timeout-ms",
        "200",
        "--idle-wait-ms",
        "15000",
        "--tasks",
        "50",
        "--task",
        "hash:10",
        "--payload",
        "8",
    ]);
    let (status, stdout, stderr) = run.finish();
    assert!(status.success(), "stdout {stdout} stderr {stderr}");
    assert_eq!(
        field(&stdout, "checksum"),
        expected_checksum(50, 8),
        "{stdout}"
    );
    assert!(field(&stdout, "executors_started") >= 1, "{stdout}");
    assert_eq!(field(&stdout, "executors_end"), 0, "{stdout}\n{stderr}");
}

/// A driver and `LocalExecutors` running `exe` instead of `flint executor`.
fn local_executors_with(
    exe: PathBuf,
    allocator: flint_engine::lifecycle::AllocatorConfig,
) -> (
    std::sync::Arc<flint_net::driver::Driver>,
    flint_net::lifecycle::local::LocalExecutors,
) {
    let driver = std::sync::Arc::new(
        flint_net::driver::Driver::builder()
            .start()
            .expect("driver starts"),
    );
    let addr = driver.local_addr().expect("listening");
    let mut config = flint_net::lifecycle::local::LocalConfig::new(exe, addr);
    config.allocator = allocator;
    let executors =
        flint_net::lifecycle::local::LocalExecutors::start(config, driver.clone()).expect("starts");
    (driver, executors)
}

#[test]
fn an_executor_that_never_registers_is_deleted_after_the_pending_timeout_and_replaced() {
    // A stand-in executor that runs but never connects.
    let script = std::env::temp_dir().join(format!(
        "flint-never-registers-{}-{}.sh",
        std::process::id(),
        unique()
    ));
    std::fs::write(&script, "#!/bin/sh\nexec sleep 60\n").expect("script");
    let chmod = Command::new("chmod")
        .args(["+x", &script.to_string_lossy()])
        .status()
        .expect("chmod");
    assert!(chmod.success());
    let (driver, executors) = local_executors_with(
        script.clone(),
        flint_engine::lifecycle::AllocatorConfig {
            initial_target: 1,
            batch_delay_us: 0,
            pending_timeout_us: 200_000,
            name_prefix: "stuck-".into(),
            ..Default::default()
        },
    );
    wait_until("two pending timeouts", || {
        let stats = executors.stats();
        stats.deleted >= 2 && stats.started >= 3
    });
    let stats = executors.stats();
    assert_eq!(
        stats.failed, 0,
        "deleted on purpose, not failures: {stats:?}"
    );
    assert_eq!(stats.registered, 0);
    assert!(executors.failed().is_none());
    executors.shutdown(Duration::ZERO);
    drop(driver);
    let _ = std::fs::remove_file(&script);
}

#[test]
fn executors_that_cannot_start_stop_the_application() {
    let (driver, executors) = local_executors_with(
        PathBuf::from("/nonexistent/flint"),
        flint_engine::lifecycle::AllocatorConfig {
            initial_target: 2,
            batch_delay_us: 0,
            failures_max: 3,
            ..Default::default()
        },
    );
    wait_until("the allocator to give up", || executors.failed().is_some());
    let reason = executors.failed().unwrap_or_default();
    assert!(reason.contains("4 executors failed"), "{reason}");
    assert_eq!(executors.stats().started, 0);
    executors.shutdown(Duration::ZERO);
    drop(driver);
}

/// A `flint executor` process for an embedded driver; killed on drop.
struct ExecutorProcess(Child);

impl ExecutorProcess {
    fn start(driver: std::net::SocketAddr, id: &str) -> ExecutorProcess {
        ExecutorProcess::start_with(driver, id, &[])
    }

    fn start_with(driver: std::net::SocketAddr, id: &str, env: &[(&str, &str)]) -> ExecutorProcess {
        let child = Command::new(env!("CARGO_BIN_EXE_flint"))
            .envs(env.iter().copied())
            .args([
                "executor",
                "--driver",
                &driver.to_string(),
                "--id",
                id,
                "--connect-timeout-s",
                "10",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .env_remove("FLINT_SECRET")
            .spawn()
            .expect("spawn flint executor");
        ExecutorProcess(child)
    }
}

impl Drop for ExecutorProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_driver_removes_an_executor_for_a_given_reason_and_its_tasks_run_elsewhere() {
    use flint_engine::scheduler::RemovalReason;
    use flint_net::job::{Job, JobOutcome};

    let driver = flint_net::driver::Driver::builder()
        .start()
        .expect("driver starts");
    let addr = driver.local_addr().expect("listening");
    let _a = ExecutorProcess::start(addr, "a");
    let _b = ExecutorProcess::start(addr, "b");
    driver
        .wait_for_executors(2, DEADLINE)
        .expect("two executors");
    let tasks = 400u64;
    let payloads = (0..tasks)
        .map(|i| bytes::Bytes::from(indexed_payload(i, 8)))
        .collect();
    let gate = Gate::new();
    let handle = driver
        .submit(Job::new(gate.task(), payloads))
        .expect("submitted");
    // a and b are removed and stopped while they provably hold attempts (at the gate); the
    // gate opens once c holds the tasks they gave back.
    let mut held = 0;
    wait_until("tasks running on a and b", || {
        driver.executors_view().is_ok_and(|view| {
            let on = |id: &str| {
                view.executors
                    .iter()
                    .find(|(e, _)| e == id)
                    .map_or(0, |e| e.1)
            };
            held = u64::from(on("a")) + u64::from(on("b"));
            on("a") > 0 && on("b") > 0
        })
    });
    driver
        .remove_executor(
            "a",
            RemovalReason::Exited {
                code: 1,
                caused_by_app: false,
            },
        )
        .expect("sent");
    wait_until("a removed", || {
        driver
            .executors_view()
            .is_ok_and(|view| view.executors.iter().all(|(name, _)| name != "a"))
    });
    // The published counters may trail the driver's view by a loop round.
    wait_until("a counted", || driver.executors_lost() >= 1);
    assert_eq!(
        driver.executors_lost(),
        1,
        "a cluster manager's report is a loss"
    );
    // Stopping an executor on purpose is not a loss either.
    assert!(driver.stop_executor("b").is_ok_and(|known| known));
    assert!(!driver.stop_executor("a").unwrap_or(true), "a is gone");
    let _c = ExecutorProcess::start(addr, "c");
    wait_until("c holding attempts", || {
        driver
            .executors_view()
            .is_ok_and(|view| view.executors.iter().any(|(e, n)| e == "c" && *n > 0))
    });
    assert_eq!(
        handle.tasks_done(),
        0,
        "nothing finished while the gate was shut"
    );
    gate.open();
    match handle.wait_timeout(DEADLINE).expect("job finishes") {
        JobOutcome::Succeeded(results) => {
            let checksum = results.iter().fold(0u64, |sum, r| {
                sum.wrapping_add(flint_cli::summary::checksum_of(r))
            });
            assert_eq!(checksum, expected_checksum(tasks, 8));
        }
        other => panic!("job did not succeed: {other:?}"),
    }
    assert_eq!(driver.executors_lost(), 1, "a stop is not a loss");
    // The attempts a and b held ran again on c.
    wait_until("the held attempts launched again", || {
        driver.stats().launched >= tasks + held
    });
    let stats = driver.stats();
    assert_eq!(stats.succeeded, tasks);
}

#[test]
fn a_surplus_executor_the_allocator_deletes_is_drained_and_loses_no_running_attempt() {
    use flint_net::job::{Job, JobOutcome};

    // Two slots per executor, so each of the two runs two sleeps at once.
    let driver = std::sync::Arc::new(
        flint_net::driver::Driver::builder()
            .config(flint_net::driver::DriverConfig {
                tasks_per_core: 2,
                ..Default::default()
            })
            .start()
            .expect("driver starts"),
    );
    let addr = driver.local_addr().expect("listening");
    let mut config =
        flint_net::lifecycle::local::LocalConfig::new(env!("CARGO_BIN_EXE_flint").into(), addr);
    config.allocator = flint_engine::lifecycle::AllocatorConfig {
        initial_target: 2,
        batch_delay_us: 0,
        name_prefix: "drain-".into(),
        ..Default::default()
    };
    let executors =
        flint_net::lifecycle::local::LocalExecutors::start(config, driver.clone()).expect("starts");
    driver
        .wait_for_executors(2, DEADLINE)
        .expect("two executors");
    let tasks = 8u64;
    let payloads = (0..tasks)
        .map(|i| bytes::Bytes::from(vec![i as u8]))
        .collect();
    let handle = driver
        .submit(Job::new("sleep:400", payloads))
        .expect("submitted");
    wait_until("both executors running tasks", || {
        driver.executors_view().is_ok_and(|view| {
            view.executors.len() == 2 && view.executors.iter().all(|(_, running)| *running > 0)
        })
    });
    // The target drops below the busy executors: the least busy one is drained, finishes what
    // it runs, and only then is stopped and deleted.
    executors.set_target(1);
    let explain = || {
        let view = driver.executors_view();
        let stats = driver.stats();
        let (lifecycle, failed) = (executors.stats(), executors.failed());
        format!(
            "lifecycle {lifecycle:?} (failed: {failed:?}); driver view {view:?}; driver {stats:?}"
        )
    };
    wait_until_or(
        "one executor drained",
        || executors.stats().drained == 1,
        explain,
    );
    // It takes no new task: it leaves while tasks still wait for the other one.
    wait_until_or(
        "the drained executor gone while tasks wait",
        || {
            driver
                .executors_view()
                .is_ok_and(|view| view.executors.len() == 1 && view.pending_tasks > 0)
        },
        explain,
    );
    match handle.wait_timeout(DEADLINE).expect("job finishes") {
        JobOutcome::Succeeded(results) => assert_eq!(results.len() as u64, tasks),
        other => panic!("job did not succeed: {other:?}"),
    }
    wait_until("the surplus executor deleted", || {
        let stats = executors.stats();
        stats.deleted == 1 && stats.registered == 1
    });
    let stats = driver.stats();
    assert_eq!(
        stats.launched - stats.speculative_launched,
        tasks,
        "every task ran once: no running attempt was lost ({stats:?})"
    );
    assert_eq!(stats.attempts_killed, 0, "{stats:?}");
    assert_eq!(driver.executors_lost(), 0);
    assert_eq!(executors.stats().failed, 0, "deleted on purpose");
    executors.shutdown(Duration::ZERO);
}

/// A driver with two task slots per core and an executor `a` draining for `drain_ms` on
/// SIGTERM beside a plain executor `b`; `tasks` sleeps of `sleep_ms` run until `a` holds some,
/// then `a` gets SIGTERM. The job's outcome, the driver's counters and `a`'s exit.
fn sigterm_mid_job(
    drain_ms: &str,
    tasks: u64,
    sleep_ms: u64,
) -> (
    flint_net::job::JobOutcome,
    flint_engine::scheduler::Stats,
    ExitStatus,
) {
    use flint_net::job::Job;

    let driver = flint_net::driver::Driver::builder()
        .config(flint_net::driver::DriverConfig {
            tasks_per_core: 2,
            ..Default::default()
        })
        .start()
        .expect("driver starts");
    let addr = driver.local_addr().expect("listening");
    let mut a = ExecutorProcess::start_with(addr, "a", &[("FLINT_DRAIN_TIMEOUT_MS", drain_ms)]);
    driver.wait_for_executors(1, DEADLINE).expect("a");
    let _b = ExecutorProcess::start(addr, "b");
    driver.wait_for_executors(2, DEADLINE).expect("b");
    let payloads = (0..tasks)
        .map(|i| bytes::Bytes::from(vec![i as u8]))
        .collect();
    let handle = driver
        .submit(Job::new(format!("sleep:{sleep_ms}"), payloads))
        .expect("submitted");
    wait_until("a running tasks", || {
        driver.executors_view().is_ok_and(|view| {
            view.executors
                .iter()
                .any(|(name, running)| name == "a" && *running > 0)
        })
    });
    let term = Command::new("kill")
        .args(["-TERM", &a.0.id().to_string()])
        .status()
        .expect("kill");
    assert!(term.success());
    let outcome = handle.wait_timeout(DEADLINE).expect("job finishes");
    let mut exit = None;
    wait_until("a exits", || {
        exit = a.0.try_wait().expect("try_wait");
        exit.is_some()
    });
    (outcome, driver.stats(), exit.expect("exited"))
}

#[test]
fn an_executor_given_sigterm_lets_its_running_attempts_finish_and_takes_no_new_ones() {
    let tasks = 8;
    let (outcome, stats, exit) = sigterm_mid_job("10000", tasks, 300);
    assert!(
        matches!(outcome, flint_net::job::JobOutcome::Succeeded(_)),
        "{outcome:?}"
    );
    assert_eq!(
        stats.launched - stats.speculative_launched,
        tasks,
        "no attempt ran twice: a's finished there ({stats:?})"
    );
    assert_eq!(stats.attempts_killed, 0, "{stats:?}");
    assert!(exit.success(), "a leaves cleanly: {exit}");
}

#[test]
fn an_executor_given_sigterm_reports_attempts_still_running_at_the_drain_timeout_killed() {
    let tasks = 4;
    let (outcome, stats, exit) = sigterm_mid_job("200", tasks, 2_000);
    assert!(
        matches!(outcome, flint_net::job::JobOutcome::Succeeded(_)),
        "their copies ran on b: {outcome:?}"
    );
    assert!(
        stats.attempts_killed >= 1,
        "reported back killed, not lost: {stats:?}"
    );
    assert_eq!(
        stats.launched - stats.speculative_launched,
        tasks + stats.attempts_killed,
        "each killed attempt ran again once ({stats:?})"
    );
    assert!(exit.success(), "a leaves cleanly: {exit}");
}
