//! Results come back whole or their task fails with the reason: big results, results too large
//! for a frame, failure texts too long for a frame, and the bound on the result bytes a job
//! keeps. Real sockets on 127.0.0.1; `flint` processes where the CLI is the subject.

mod common;

use common::{wait_until, DEADLINE};

use std::net::SocketAddr;
use std::process::Command;
use std::thread::JoinHandle;

use bytes::Bytes;
use flint_cli::summary::indexed_payload;
use flint_net::driver::{Driver, DriverConfig};
use flint_net::executor::{self, ExecutorConfig, ExecutorError, ExecutorSummary};
use flint_net::job::{Job, JobOutcome};
use flint_net::{Registry, TaskError};

/// Frames this small make "larger than a frame" cheap to reach.
const SMALL_FRAME_BYTES: usize = 64 * 1024;

/// Functions for these tests beside the built-ins: `inflate` returns 100 KB, `shout` fails
/// with a 200 KB message.
fn registry() -> Registry {
    let mut registry = Registry::with_builtins();
    registry.register("inflate", |_, _| Ok(Bytes::from(vec![1u8; 100_000])));
    registry.register("shout", |_, _| Err(TaskError::new("!".repeat(200_000))));
    registry
}

/// A driver and one in-process executor (on a thread, over real TCP), both with `frame_bytes`
/// frames.
fn cluster(frame_bytes: usize) -> (Driver, JoinHandle<Result<ExecutorSummary, ExecutorError>>) {
    let mut config = DriverConfig {
        frame_size_max: frame_bytes,
        ..DriverConfig::default()
    };
    config.scheduler.max_failures = 1;
    let driver = Driver::builder()
        .config(config)
        .start()
        .expect("driver starts");
    let addr: SocketAddr = driver.local_addr().expect("listening");
    let executor = std::thread::spawn(move || {
        let config = ExecutorConfig {
            frame_size_max: frame_bytes,
            ..ExecutorConfig::new(addr, "e1")
        };
        executor::run(config, registry())
    });
    driver
        .wait_for_executors(1, DEADLINE)
        .expect("the executor registers");
    (driver, executor)
}

fn run(driver: &Driver, job: Job) -> JobOutcome {
    let handle = driver.submit(job).expect("submitted");
    handle
        .wait_timeout(DEADLINE)
        .expect("the job ends in bounded time")
}

fn stop(driver: Driver, executor: JoinHandle<Result<ExecutorSummary, ExecutorError>>) {
    driver.stop_executors(DEADLINE).expect("the executor stops");
    assert!(executor.join().expect("no panic").is_ok());
}

/// Issue 11.1: `flint local` with 8 MiB + 1 byte results (over half the 16 MiB frame) used to
/// report every task FINISHED with a replacement text as its result (checksum
/// 4927322019870683222). Each result must arrive whole: the checksum of `echo` over
/// `indexed_payload(i)` is 0 + 1 + 2.
#[test]
fn results_over_half_the_frame_size_arrive_whole() {
    let output = Command::new(env!("CARGO_BIN_EXE_flint"))
        .args([
            "local",
            "--executors",
            "1",
            "--tasks",
            "3",
            "--task",
            "echo",
            "--payload",
            "8388609",
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
    assert!(stdout.contains("\"checksum\":3,"), "{stdout}");
    assert!(stdout.contains("\"succeeded\":3"), "{stdout}");
}

/// Issue 11.1, through the API: a result just under a frame arrives byte for byte; one larger
/// than a frame fails its task with a reason that says so, never a success with other bytes.
#[test]
fn a_result_larger_than_a_frame_fails_its_task_and_a_smaller_one_arrives_exactly() {
    let (driver, executor) = cluster(SMALL_FRAME_BYTES);
    let payload = Bytes::from(indexed_payload(7, SMALL_FRAME_BYTES - 8192));
    match run(&driver, Job::new("echo", vec![payload.clone(); 2])) {
        JobOutcome::Succeeded(results) => assert_eq!(results, vec![payload.clone(); 2]),
        other => panic!("echo under a frame must succeed: {other:?}"),
    }
    match run(&driver, Job::new("inflate", vec![Bytes::new()])) {
        JobOutcome::Failed(reasons) => assert!(
            reasons
                .iter()
                .any(|r| r.contains("larger than a status frame carries")),
            "{reasons:?}"
        ),
        other => panic!("a result over the frame size must fail: {other:?}"),
    }
    stop(driver, executor);
}

/// Issue 11.2: a failure text longer than a frame was dropped by the encoder and its task never
/// ended. It must end, failed, with the text cut to a bound.
#[test]
fn a_failure_text_longer_than_a_frame_ends_its_task_with_the_text_cut() {
    let (driver, executor) = cluster(SMALL_FRAME_BYTES);
    match run(&driver, Job::new("shout", vec![Bytes::new(); 3])) {
        JobOutcome::Failed(reasons) => {
            let longest = reasons.iter().map(String::len).max().unwrap_or(0);
            assert!(reasons.iter().any(|r| r.contains("!!!!")), "{reasons:?}");
            assert!(longest < 8192, "reasons are bounded, got {longest} bytes");
        }
        other => panic!("shout fails: {other:?}"),
    }
    stop(driver, executor);
}

/// Issue 11.3: a job keeps at most `result_bytes_max` bytes of results; the result that goes
/// over fails the job with a reason naming the limit, instead of growing the driver until
/// allocation fails. A job that does not keep results has no such bound and an empty list.
#[test]
fn a_job_over_its_result_bound_fails_naming_it_and_one_that_keeps_nothing_succeeds() {
    let (driver, executor) = cluster(SMALL_FRAME_BYTES);
    let payloads = vec![Bytes::from(vec![3u8; 1000]); 10];
    match run(
        &driver,
        Job::new("echo", payloads.clone()).result_bytes_max(4500),
    ) {
        JobOutcome::Failed(reasons) => assert!(
            reasons
                .iter()
                .any(|r| r.contains("result_bytes_max = 4500")),
            "{reasons:?}"
        ),
        other => panic!("results over the bound must fail the job: {other:?}"),
    }
    let seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = seen.clone();
    let job = Job::new("echo", payloads)
        .result_bytes_max(4500)
        .keep_results(false)
        .on_result(move |_, result| {
            if result.is_ok_and(|bytes| bytes.len() == 1000) {
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        });
    assert_eq!(run(&driver, job), JobOutcome::Succeeded(Vec::new()));
    wait_until("every result observed", || {
        seen.load(std::sync::atomic::Ordering::SeqCst) == 10
    });
    stop(driver, executor);
}
