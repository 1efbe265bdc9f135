//! The embedding API in local mode: the same driver, jobs and functions on an in-process pool,
//! no sockets needed.

mod common;

use common::DEADLINE;

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;
use std::time::Duration;

use bytes::Bytes;
use flint_engine::functions::{fnv1a64, Registry, TaskError};
use flint_net::driver::Driver;
use flint_net::job::{Job, JobOutcome, TaskLocality};

fn local_driver(registry: Registry) -> Driver {
    Driver::builder()
        .local(2, registry)
        .start()
        .expect("local driver starts")
}

#[test]
fn a_local_job_returns_every_result_in_task_order() {
    let driver = local_driver(Registry::with_builtins());
    let payloads: Vec<Bytes> = (0..500u64)
        .map(|i| Bytes::from(i.to_le_bytes().to_vec()))
        .collect();
    let outcome = driver
        .submit(Job::new("hash", payloads.clone()))
        .expect("submitted")
        .wait_timeout(DEADLINE)
        .expect("done");
    let JobOutcome::Succeeded(results) = outcome else {
        panic!("{outcome:?}")
    };
    for (payload, result) in payloads.iter().zip(&results) {
        assert_eq!(&result[..], &fnv1a64(payload).to_le_bytes());
    }
}

#[test]
fn a_registered_function_runs_and_a_panicking_one_fails_the_job_with_its_message() {
    let mut registry = Registry::new();
    registry.register("double", |_, payload| {
        Ok(payload
            .iter()
            .map(|b| b.wrapping_mul(2))
            .collect::<Vec<u8>>()
            .into())
    });
    registry.register("explode", |ctx, _| -> Result<Bytes, TaskError> {
        panic!("boom in task {}", ctx.task_id)
    });
    let driver = local_driver(registry);

    let outcome = driver
        .submit(Job::new("double", vec![Bytes::from_static(&[1, 2, 3])]))
        .expect("submitted")
        .wait();
    assert_eq!(
        outcome,
        JobOutcome::Succeeded(vec![Bytes::from_static(&[2, 4, 6])])
    );

    assert_fails_with(&driver, "explode", "task panicked: boom in task");
    assert_fails_with(&driver, "missing", "unknown function \"missing\"");
}

/// Runs a one-task job of `function` and checks that it fails with a reason containing `reason`.
fn assert_fails_with(driver: &Driver, function: &str, reason: &str) {
    let outcome = driver
        .submit(Job::new(function, vec![Bytes::new()]))
        .expect("submitted")
        .wait();
    let JobOutcome::Failed(reasons) = outcome else {
        panic!("{outcome:?}")
    };
    assert!(reasons.iter().any(|r| r.contains(reason)), "{reasons:?}");
}

#[test]
fn a_cancelled_job_reports_cancelled() {
    let driver = local_driver(Registry::with_builtins());
    let handle = driver
        .submit(Job::new("sleep:60000", vec![Bytes::new(); 8]))
        .expect("submitted");
    handle.cancel();
    assert_eq!(
        handle.wait_timeout(DEADLINE).expect("ends"),
        JobOutcome::Cancelled
    );
}

/// Wakes the test thread: a minimal executor for awaiting one future.
struct ThreadWaker(Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

fn block_on<F: Future>(future: F) -> F::Output {
    let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let mut context = Context::from_waker(&waker);
    let mut future = pin!(future);
    loop {
        match future.as_mut().poll(&mut context) {
            Poll::Ready(output) => return output,
            Poll::Pending => std::thread::park_timeout(Duration::from_millis(100)),
        }
    }
}

#[test]
fn a_job_handle_can_be_awaited() {
    let driver = local_driver(Registry::with_builtins());
    let handle = driver
        .submit(Job::new("echo", vec![Bytes::from_static(b"hi"); 3]))
        .expect("submitted");
    assert_eq!(
        block_on(handle),
        JobOutcome::Succeeded(vec![Bytes::from_static(b"hi"); 3])
    );
}

#[test]
fn one_short_job_after_another_each_ends_at_once_when_its_task_runs_inline() {
    // Once `noop` is known short, a one-task job runs on the driver's own loop; the outcome
    // its completion makes in that round must reach the handle in the same round, with
    // nothing else to wake the loop (a regression hung the closed loop here).
    let driver = local_driver(Registry::with_builtins());
    for i in 0..64 {
        let outcome = driver
            .submit(Job::new("noop", vec![Bytes::new()]))
            .expect("submitted")
            .wait_timeout(Duration::from_secs(2));
        assert!(
            matches!(outcome, Ok(JobOutcome::Succeeded(_))),
            "job {i}: {outcome:?}"
        );
    }
}

#[test]
fn a_job_keeping_results_takes_its_own_copy_of_a_shared_list_on_the_submitting_thread() {
    // No executor: the jobs wait, holding what the loop has of them.
    let driver = Driver::builder().start().expect("driver starts");
    let list: Arc<[Bytes]> = (0..1_000u32)
        .map(|i| Bytes::from(i.to_le_bytes().to_vec()))
        .collect();
    let kept = (driver.try_submit(Job::with_payloads("noop", list.clone())))
        .unwrap_or_else(|rejected| panic!("submitted: {}", rejected.error));
    assert_eq!(
        Arc::strong_count(&list),
        1,
        "copied before it left: the loop never copies it at a first result"
    );
    let streamed = Job::with_payloads("noop", list.clone()).keep_results(false);
    let streamed = (driver.try_submit(streamed))
        .unwrap_or_else(|rejected| panic!("submitted: {}", rejected.error));
    assert_eq!(Arc::strong_count(&list), 2, "shared, not copied");
    for handle in [kept, streamed] {
        handle.cancel();
        assert_eq!(handle.wait(), JobOutcome::Cancelled);
    }
}

/// A big job with locality (its specs made on the submitting thread, its records built over
/// several loop rounds) runs every task once, in order, and jobs submitted behind it run too.
#[test]
fn a_big_job_with_locality_returns_every_result_in_task_order_and_others_run_beside_it() {
    let driver = local_driver(Registry::with_builtins());
    let n = 50_000u64;
    let payloads: Vec<Bytes> = (0..n)
        .map(|i| Bytes::from(i.to_le_bytes().to_vec()))
        .collect();
    let names: Vec<std::sync::Arc<str>> = (0..100).map(|h| format!("host{h}").into()).collect();
    let locality: Vec<TaskLocality> = (0..n)
        .map(|i| TaskLocality {
            executors: vec![format!("gone-{}", i % 3)],
            // One shared name per host, and a name of its own: both ways of naming hosts.
            hosts: vec![
                names[(i % 100) as usize].clone(),
                format!("host{}", (i * 7 + 3) % 100).into(),
            ],
        })
        .collect();
    let big = Job::new("hash", payloads.clone()).locality(locality);
    let big = driver.submit(big).expect("submitted");
    let small = Job::new("hash", vec![Bytes::from_static(b"x")]).priority(10);
    let small = driver.submit(small).expect("submitted");
    let outcome = small.wait_timeout(DEADLINE).expect("done");
    assert!(matches!(outcome, JobOutcome::Succeeded(_)), "{outcome:?}");
    let outcome = big.wait_timeout(DEADLINE).expect("done");
    let JobOutcome::Succeeded(results) = outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!(results.len(), payloads.len());
    for (payload, result) in payloads.iter().zip(&results) {
        assert_eq!(&result[..], &fnv1a64(payload).to_le_bytes());
    }
}
