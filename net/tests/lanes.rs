//! Lanes in one process (an executor on a thread, the driver beside it): a 2-core executor runs
//! short tasks to completion on both of its lane threads, and a task that panics fails only its
//! attempt.

mod common;

use common::DEADLINE;

use std::collections::BTreeSet;
use std::net::SocketAddr;

use bytes::Bytes;
use flint_net::driver::{Driver, DriverConfig};
use flint_net::executor::{self, ExecutorConfig};
use flint_net::job::{Job, JobOutcome};
use flint_net::Registry;

/// `where`: the name of the thread that ran it; it panics on the payload `boom`.
fn registry() -> Registry {
    let mut registry = Registry::with_builtins();
    registry.register("where", |_, payload| {
        assert_ne!(&payload[..], b"boom", "boom in a lane");
        let name = std::thread::current().name().unwrap_or("").to_owned();
        Ok(Bytes::from(name))
    });
    registry
}

fn two_core_executor(addr: SocketAddr) -> std::thread::JoinHandle<()> {
    let config = ExecutorConfig {
        cores: 2,
        connect_timeout: DEADLINE,
        ..ExecutorConfig::new(addr, "laned")
    };
    std::thread::spawn(move || {
        let summary = executor::run(config, registry()).expect("stopped by the driver");
        assert!(summary.task_attempts > 0);
    })
}

/// Runs `where` on `payloads` as one job; the thread names, or the failure.
fn run(driver: &Driver, payloads: Vec<Bytes>) -> Result<Vec<String>, Vec<String>> {
    let job = Job::new("where", payloads).max_failures(1);
    match driver
        .submit(job)
        .expect("submitted")
        .wait_timeout(DEADLINE)
    {
        Ok(JobOutcome::Succeeded(results)) => Ok(results
            .iter()
            .map(|r| String::from_utf8_lossy(r).into_owned())
            .collect()),
        Ok(JobOutcome::Failed(reasons)) => Err(reasons),
        other => panic!("{other:?}"),
    }
}

#[test]
fn short_tasks_run_on_both_lane_threads_and_a_panicking_task_fails_only_its_attempt() {
    let driver = Driver::builder()
        .config(DriverConfig::default())
        .start()
        .expect("driver starts");
    let addr = driver.local_addr().expect("listening");
    let executor = two_core_executor(addr);
    driver.wait_for_executors(1, DEADLINE).expect("registers");
    common::wait_until("lane 1 to join", || {
        driver
            .observer()
            .view(DEADLINE)
            .is_ok_and(|view| view.executors.first().is_some_and(|e| e.lanes_joined == 2))
    });
    // Jobs of two tasks: one to each lane (each holds fewest in turn). Once `where` is known
    // to be short, each lane runs its task itself.
    let mut threads = BTreeSet::new();
    for _ in 0..200 {
        let names = run(&driver, vec![Bytes::new(), Bytes::new()]).expect("succeeds");
        threads.extend(names);
    }
    for lane in ["flint-executor-0", "flint-executor-1"] {
        assert!(
            threads.contains(lane),
            "nothing ran inline on {lane}: {threads:?}"
        );
    }
    // A panicking task (inline on its lane, or on the pool) fails that attempt, with the
    // message; the lanes run on.
    let failed = run(&driver, vec![Bytes::from("boom"), Bytes::new()]).expect_err("fails");
    assert!(
        failed
            .iter()
            .any(|r| r.contains("task panicked") && r.contains("boom in a lane")),
        "{failed:?}"
    );
    let names = run(&driver, vec![Bytes::new(), Bytes::new()]).expect("the lanes run on");
    assert_eq!(names.len(), 2);
    assert_eq!(driver.executors(), 1);
    assert_eq!(driver.executors_lost(), 0);
    driver.stop_executors(DEADLINE).expect("stops");
    executor.join().expect("the executor's thread");
}
