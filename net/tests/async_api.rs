//! Issue 13.2-13.3: a submit that never blocks and results as they come. Submitting allocates
//! the id and checks the limits on the caller's thread; a full inbox hands the job back
//! (`try_submit`) or waits without blocking (`submit_async`); results stream; dropping a handle
//! cancels its job unless detached; a job's deadline fails it.

mod common;

use common::{wait_until, DEADLINE};

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use flint_net::driver::{Driver, DriverConfig, DriverError, Rejected, FUNCTION_NAME_MAX_BYTES};
use flint_net::job::{Job, JobOutcome, TaskResult};
use flint_net::Registry;
use futures_core::Stream;

fn local_driver(cores: u32) -> Driver {
    Driver::builder()
        .local(cores, Registry::with_builtins())
        .start()
        .expect("driver starts")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("tokio")
}

/// The next item of a stream (futures-core has no combinators).
async fn next<S: Stream + Unpin>(stream: &mut S) -> Option<S::Item> {
    std::future::poll_fn(|cx| Pin::new(&mut *stream).poll_next(cx)).await
}

#[test]
fn results_stream_as_they_come_and_the_outcome_follows() {
    let driver = local_driver(2);
    runtime().block_on(async {
        let payloads: Vec<Bytes> = (0..10u8).map(|i| Bytes::from(vec![i; 3])).collect();
        let job = Job::new("echo", payloads.clone())
            .stream_results()
            .keep_results(false);
        let mut handle = driver.submit_async(job).await.expect("submitted");
        let mut seen: Vec<TaskResult> = Vec::new();
        {
            let mut stream = handle.results_stream();
            while let Some(result) = tokio::time::timeout(DEADLINE, next(&mut stream))
                .await
                .expect("results come")
            {
                seen.push(result);
            }
        }
        seen.sort_by_key(|(index, _)| *index);
        let expected: Vec<TaskResult> = (0..10u32)
            .map(|i| (i, Ok(payloads[i as usize].clone())))
            .collect();
        assert_eq!(seen, expected);
        let outcome = tokio::time::timeout(DEADLINE, handle).await.expect("ends");
        assert_eq!(outcome, JobOutcome::Succeeded(Vec::new()));
    });
    // The blocking iterator gives the same.
    let mut handle = driver
        .submit(Job::new("echo", vec![Bytes::from_static(b"x"); 4]).stream_results())
        .expect("submitted");
    assert_eq!(handle.results().count(), 4);
    assert!(matches!(handle.wait(), JobOutcome::Succeeded(r) if r.len() == 4));
}

#[test]
fn dropping_a_handle_cancels_its_job_and_a_detached_one_runs_to_its_end() {
    let driver = local_driver(1);
    let handle = driver
        .submit(Job::new("sleep:60000", vec![Bytes::new(); 4]))
        .expect("submitted");
    assert_eq!(driver.active_jobs(), 1);
    drop(handle);
    wait_until("the dropped job is cancelled", || driver.active_jobs() == 0);

    let seen = Arc::new(AtomicUsize::new(0));
    let counter = seen.clone();
    let job = Job::new("sleep:20", vec![Bytes::new(); 3]).on_result(move |_, result| {
        if result.is_ok() {
            counter.fetch_add(1, Ordering::SeqCst);
        }
    });
    driver.submit(job).expect("submitted").detach();
    wait_until("the detached job's results", || {
        seen.load(Ordering::SeqCst) == 3
    });
}

#[test]
fn a_job_past_its_deadline_fails_naming_it() {
    let driver = local_driver(1);
    let handle = driver
        .submit(Job::new("sleep:60000", vec![Bytes::new(); 2]).deadline(Duration::from_millis(50)))
        .expect("submitted");
    match handle
        .wait_timeout(DEADLINE)
        .expect("ends well before the sleep")
    {
        JobOutcome::Failed(reasons) => {
            assert!(
                reasons.iter().any(|r| r.contains("deadline")),
                "{reasons:?}"
            )
        }
        other => panic!("the deadline fails the job: {other:?}"),
    }
}

#[test]
fn limits_are_checked_on_the_callers_thread_and_the_job_comes_back() {
    let mut config = DriverConfig::default();
    config.scheduler.pending_tasks_max = 10;
    config.local_cores = Some(1);
    let driver = Driver::builder()
        .config(config)
        .start()
        .expect("driver starts");
    match driver.try_submit(Job::new("noop", vec![Bytes::new(); 11])) {
        Err(Rejected {
            error: DriverError::Submit(reason),
            job,
        }) => {
            assert!(reason.contains("pending_tasks_max = 10"), "{reason}");
            assert_eq!(format!("{job:?}"), "Job { function: \"noop\", tasks: 11 }");
        }
        other => panic!("over the limit: {other:?}"),
    }
    let handle = driver
        .try_submit(Job::new("noop", vec![Bytes::new(); 10]))
        .expect("at the limit");
    assert!(matches!(handle.wait(), JobOutcome::Succeeded(_)));
}

/// Submits one-task jobs to `driver`, whose loop is held, until one comes back `Busy`: the
/// handles accepted, and the job handed back.
fn fill_inbox(driver: &Driver) -> (Vec<flint_net::job::JobHandle>, Rejected) {
    let mut accepted = Vec::new();
    let busy = loop {
        match driver.try_submit(Job::new("noop", vec![Bytes::new()])) {
            Ok(handle) => accepted.push(handle),
            Err(rejected) => break rejected,
        }
        assert!(accepted.len() < 1_000_000, "the inbox never filled");
    };
    assert!(matches!(busy.error, DriverError::Busy), "{:?}", busy.error);
    (accepted, busy)
}

/// While the loop is held (an observer blocks it) the inbox fills: `try_submit` hands jobs
/// back with `Busy`, and `submit_async` waits without blocking its thread (a second task on
/// the same single-threaded runtime keeps running) and goes through once the loop makes room.
#[test]
fn a_full_inbox_hands_jobs_back_and_submit_async_waits_without_blocking() {
    let driver = Arc::new(local_driver(1));
    let (held, release_tx) = common::hold_loop(&driver);
    let (accepted, busy) = fill_inbox(&driver);
    // The submissions queue (1,024 jobs) filled first, then the inbox took jobs in messages
    // of their own: both paths are in what comes back below.
    assert!(accepted.len() > 1024, "{} accepted", accepted.len());
    let ticks = Arc::new(AtomicUsize::new(0));
    runtime().block_on(async {
        let ticker = ticks.clone();
        let tick = tokio::spawn(async move {
            loop {
                ticker.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        });
        let driver_for_submit = driver.clone();
        let submitted = tokio::spawn(async move {
            let handle = driver_for_submit
                .submit_async(*busy.job)
                .await
                .expect("room comes");
            handle.await
        });
        // The submitter waits; the ticker runs on the same thread meanwhile.
        while ticks.load(Ordering::SeqCst) < 20 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert!(!submitted.is_finished(), "no room yet");
        release_tx.send(()).expect("release");
        let outcome = tokio::time::timeout(DEADLINE, submitted)
            .await
            .expect("submitted in time")
            .expect("no panic");
        assert!(matches!(outcome, JobOutcome::Succeeded(_)), "{outcome:?}");
        tick.abort();
    });
    for handle in accepted {
        assert!(matches!(handle.wait(), JobOutcome::Succeeded(_)));
    }
    assert!(matches!(held.wait(), JobOutcome::Succeeded(_)));
}

/// While the loop is held and its inbox full, the blocking `submit` backs off and tries again
/// (it neither hands the job back nor fails) and goes through once the loop makes room; a job
/// refused for what it is comes back at once, without retries.
#[test]
fn a_full_inbox_makes_submit_back_off_until_the_loop_makes_room() {
    let driver = Arc::new(local_driver(1));
    let (held, release_tx) = common::hold_loop(&driver);
    let (accepted, busy) = fill_inbox(&driver);
    let too_long = Job::new("f".repeat(FUNCTION_NAME_MAX_BYTES + 1), vec![Bytes::new()]);
    assert!(
        matches!(driver.submit(too_long), Err(DriverError::Submit(_))),
        "refused at once, busy or not"
    );
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let submitter = driver.clone();
    let thread = std::thread::spawn(move || {
        let _ = done_tx.send(submitter.submit(*busy.job));
    });
    // Still trying while the loop is held (a wrong `submit` answers `Busy` at once).
    match done_rx.recv_timeout(Duration::from_millis(50)) {
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
        other => panic!("submit returned while the inbox was full: {other:?}"),
    }
    release_tx.send(()).expect("release");
    let handle = (done_rx.recv_timeout(DEADLINE))
        .expect("submit returned once room came")
        .expect("submitted");
    thread.join().expect("no panic");
    assert!(matches!(
        handle.wait_timeout(DEADLINE),
        Ok(JobOutcome::Succeeded(_))
    ));
    for handle in accepted {
        assert!(matches!(handle.wait(), JobOutcome::Succeeded(_)));
    }
    assert!(matches!(held.wait(), JobOutcome::Succeeded(_)));
}

#[test]
fn waiting_for_executors_is_answered_when_they_register() {
    let driver = Arc::new(Driver::builder().start().expect("driver starts"));
    let addr = driver.local_addr().expect("listening");
    runtime().block_on(async {
        let waiter = driver.clone();
        let waiting = tokio::spawn(async move { waiter.wait_for_executors_async(1).await });
        let executor = std::thread::spawn(move || {
            let config = flint_net::executor::ExecutorConfig::new(addr, "late");
            flint_net::executor::run(config, Registry::with_builtins())
        });
        tokio::time::timeout(DEADLINE, waiting)
            .await
            .expect("answered")
            .expect("no panic")
            .expect("registered");
        let view = driver.executors_view_async().await.expect("view");
        assert_eq!(view.executors.len(), 1);
        driver.stop_executors(DEADLINE).expect("stops");
        assert!(executor.join().expect("no panic").is_ok());
    });
    // The loop may still be draining the abandoned asks (a full inbox answers Busy): ask
    // again until it takes the wait, which must then time out rather than be turned away.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let answer = loop {
        match driver.wait_for_executors(5, Duration::from_millis(50)) {
            Err(DriverError::Busy) if std::time::Instant::now() < deadline => {
                std::thread::yield_now()
            }
            other => break other,
        }
    };
    assert!(matches!(answer, Err(DriverError::Timeout(_))), "{answer:?}");
}

/// Used only to name the handle's future type in a bound: it is `Send`, so it can be awaited
/// from a multi-threaded runtime's task.
#[allow(dead_code)]
fn handle_future_is_send(handle: flint_net::job::JobHandle) -> impl Future + Send {
    handle
}

/// Waiting for executors keeps a reply per waiter on the driver's loop: waiters that gave up
/// (timed out, dropped the future) must not fill that table, or later waiters would be turned
/// away (`Stopped`) instead of waiting.
#[test]
fn abandoned_waits_for_executors_do_not_fill_the_drivers_table() {
    let driver = Driver::builder().start().expect("driver starts");
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let mut sent = 0;
    while sent < 6000 {
        // Polled once (the ask is sent), then dropped (abandoned). A full inbox answers Busy at
        // once: let the loop catch up and send again.
        let mut waiting = std::pin::pin!(driver.wait_for_executors_async(5));
        match waiting.as_mut().poll(&mut cx) {
            std::task::Poll::Pending => sent += 1,
            std::task::Poll::Ready(Err(DriverError::Busy)) => std::thread::yield_now(),
            std::task::Poll::Ready(other) => panic!("{other:?}"),
        }
    }
    // The loop may still be draining the abandoned asks (a full inbox answers Busy): ask
    // again until it takes the wait, which must then time out rather than be turned away.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let answer = loop {
        match driver.wait_for_executors(5, Duration::from_millis(50)) {
            Err(DriverError::Busy) if std::time::Instant::now() < deadline => {
                std::thread::yield_now()
            }
            other => break other,
        }
    };
    assert!(matches!(answer, Err(DriverError::Timeout(_))), "{answer:?}");
}
