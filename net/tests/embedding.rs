//! The embedding API keeps what the caller asked for and says what went wrong: builder settings
//! survive `config()`, and a busy driver or a call from its own loop is not "stopped".

mod common;

use common::{free_port, DEADLINE};

use std::net::SocketAddr;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use flint_engine::scheduler::RemovalReason;
use flint_net::driver::{Driver, DriverConfig, DriverError};
use flint_net::executor::{self, ExecutorConfig, ExecutorError, ExecutorSummary};
use flint_net::handshake::Secret;
use flint_net::job::{Job, JobOutcome};
use flint_net::Registry;

fn executor_with(
    addr: SocketAddr,
    secret: Option<Secret>,
) -> Result<ExecutorSummary, ExecutorError> {
    let config = ExecutorConfig {
        secret,
        connect_timeout: DEADLINE,
        ..ExecutorConfig::new(addr, format!("e{}", common::unique()))
    };
    executor::run(config, Registry::with_builtins())
}

/// Issue 11.8: `listen` and `secret` set before `config()` were thrown away (asked for port
/// 47123, got 40349; the secret was dropped, so anyone could join).
#[test]
fn listen_and_secret_set_before_config_are_kept() {
    let port = free_port();
    let listen = SocketAddr::from(([127, 0, 0, 1], port));
    let secret = Secret::new(b"a secret for this test".to_vec()).expect("secret");
    let driver = Driver::builder()
        .listen(listen)
        .secret(Some(secret.clone()))
        .config(DriverConfig::default())
        .start()
        .expect("driver starts");
    assert_eq!(driver.local_addr(), Some(listen));
    assert!(
        matches!(executor_with(listen, None), Err(ExecutorError::Refused(_))),
        "an executor without the secret is refused"
    );
    let joined = std::thread::spawn(move || executor_with(listen, Some(secret)));
    driver.wait_for_executors(1, DEADLINE).expect("joins");
    driver.stop_executors(DEADLINE).expect("stops");
    assert!(joined.join().expect("no panic").is_ok());
}

/// Issue 11.8: every ask error used to read as `DriverError::Stopped`. Asking from the driver's
/// own loop (an `on_result` observer) is `SameLoop`; a full inbox is `Busy`; both while the
/// driver is alive and goes on to finish the job.
#[test]
fn a_busy_driver_and_a_call_from_its_loop_are_not_reported_stopped() {
    let driver = Arc::new(
        Driver::builder()
            .local(1, Registry::with_builtins())
            .start()
            .expect("driver starts"),
    );
    let slot: Arc<Mutex<Option<Arc<Driver>>>> = Arc::new(Mutex::new(Some(driver.clone())));
    let (blocked_tx, blocked_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let release_rx = Mutex::new(release_rx);
    let observer_slot = slot.clone();
    let job = Job::new("noop", vec![Bytes::new()]).on_result(move |_, _| {
        let me = observer_slot.lock().expect("lock").take();
        let from_loop = me.map(|driver| driver.executors_view().map(|_| ()));
        let _ = blocked_tx.send(from_loop);
        // Hold the driver's loop until the test has filled its inbox.
        let _ = release_rx.lock().expect("lock").recv_timeout(DEADLINE);
    });
    let handle = driver.submit(job).expect("submitted");
    let from_loop = blocked_rx.recv_timeout(DEADLINE).expect("the observer ran");
    assert!(
        matches!(from_loop, Some(Err(DriverError::SameLoop))),
        "{from_loop:?}"
    );
    let mut busy = None;
    for _ in 0..1_000_000 {
        if let Err(error) = driver.remove_executor("nobody", RemovalReason::Killed) {
            busy = Some(error);
            break;
        }
    }
    assert!(matches!(busy, Some(DriverError::Busy)), "{busy:?}");
    release_tx.send(()).expect("release");
    assert_eq!(
        handle.wait_timeout(DEADLINE).expect("ends"),
        JobOutcome::Succeeded(vec![Bytes::new()])
    );
    common::wait_until("the driver answers again", || {
        driver.executors_view().is_ok()
    });
}

/// A driver whose loop stopped (an observer panicked on it) refuses jobs as `Stopped` and
/// hands them back, rather than queueing them for a loop that will never take them.
#[test]
fn a_driver_whose_loop_stopped_hands_jobs_back_as_stopped() {
    let driver = Driver::builder()
        .local(1, Registry::with_builtins())
        .start()
        .expect("driver starts");
    let job = Job::new("noop", vec![Bytes::new()]).on_result(|_, _| panic!("observer bug"));
    driver.submit(job).expect("submitted").detach();
    common::wait_until("the loop stops", || {
        matches!(driver.executors_view(), Err(DriverError::Stopped))
    });
    let rejected = driver
        .try_submit(Job::new("noop", vec![Bytes::from_static(b"x")]))
        .expect_err("refused");
    assert!(
        matches!(rejected.error, DriverError::Stopped),
        "{:?}",
        rejected.error
    );
    assert_eq!(driver.active_jobs(), 1, "only the first job was admitted");
}

/// A payload over what a launch frame carries is refused on the submitting thread, the job
/// handed back, before the loop sees it (which checks no payload: a job of millions of tasks
/// scanned there would hold it milliseconds); the next job runs.
#[test]
fn a_payload_over_the_frame_size_is_refused_when_submitted_and_the_job_handed_back() {
    let frame_size_max = 1 << 20;
    let driver = Driver::builder()
        .config(DriverConfig {
            frame_size_max,
            ..DriverConfig::default()
        })
        .local(1, Registry::with_builtins())
        .start()
        .expect("driver starts");
    let payloads = vec![Bytes::new(), Bytes::from(vec![0u8; frame_size_max])];
    let rejected = driver
        .try_submit(Job::new("noop", payloads))
        .expect_err("refused");
    match &rejected.error {
        DriverError::Submit(why) => assert!(why.starts_with("task 1 payload is"), "{why}"),
        other => panic!("refused as {other:?}"),
    }
    // Handed back as it was: submitted again, it is refused again.
    assert!(matches!(
        driver.submit(*rejected.job),
        Err(DriverError::Submit(_))
    ));
    assert_eq!(driver.active_jobs(), 0, "nothing admitted");
    let fits = driver
        .submit(Job::new("echo", vec![Bytes::from_static(b"ok")]))
        .expect("submitted");
    assert_eq!(
        fits.wait_timeout(DEADLINE).expect("ends"),
        JobOutcome::Succeeded(vec![Bytes::from_static(b"ok")])
    );
}

/// A job queued while the loop's inbox is full (its notice refused) still runs once the loop
/// gets going: the loop looks at the submissions queue at the end of its rounds.
#[test]
fn a_job_queued_while_the_inbox_is_full_runs_when_the_loop_is_back() {
    let driver = Driver::builder()
        .local(1, Registry::with_builtins())
        .start()
        .expect("driver starts");
    let (held, release_tx) = common::hold_loop(&driver);
    // Fill the inbox with messages that are not submissions.
    let mut full = false;
    for _ in 0..1_000_000 {
        if let Err(DriverError::Busy) = driver.remove_executor("nobody", RemovalReason::Killed) {
            full = true;
            break;
        }
    }
    assert!(full, "the inbox filled");
    // Queued; its notice finds the inbox full.
    let queued = driver
        .try_submit(Job::new("echo", vec![Bytes::from_static(b"q")]))
        .expect("queued");
    release_tx.send(()).expect("release");
    assert!(matches!(
        held.wait_timeout(DEADLINE),
        Ok(JobOutcome::Succeeded(_))
    ));
    assert_eq!(
        queued.wait_timeout(DEADLINE).expect("runs"),
        JobOutcome::Succeeded(vec![Bytes::from_static(b"q")])
    );
}

/// One observer many jobs share (`Job::on_result_shared`) sees each job's results under that
/// job's tag, once each, as a job's own observer (`Job::on_result`) would.
#[test]
fn a_shared_result_observer_sees_each_jobs_results_under_its_tag() {
    let driver = Driver::builder()
        .local(2, Registry::with_builtins())
        .start()
        .expect("driver starts");
    /// A result as the observer saw it: the job's tag, the task's index, its bytes.
    type Seen = (u64, u32, Vec<u8>);
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let sink = seen.clone();
    let observer: flint_net::job::SharedResultObserver = Arc::new(move |tag, index, result| {
        let bytes = result.expect("echo succeeds").to_vec();
        sink.lock().expect("lock").push((tag, index, bytes));
    });
    let jobs = [(7u64, [b"a", b"b"]), (1_000_000_007, [b"c", b"d"])];
    let handles: Vec<_> = (jobs.iter())
        .map(|(tag, payloads)| {
            let payloads = payloads.iter().map(|p| Bytes::from_static(*p)).collect();
            let job = Job::new("echo", payloads)
                .keep_results(false)
                .on_result_shared(&observer, *tag);
            driver.submit(job).expect("submitted")
        })
        .collect();
    for handle in handles {
        assert_eq!(
            handle.wait_timeout(DEADLINE).expect("ends"),
            JobOutcome::Succeeded(Vec::new())
        );
    }
    let mut seen = std::mem::take(&mut *seen.lock().expect("lock"));
    seen.sort();
    let expected: Vec<Seen> = (jobs.iter())
        .flat_map(|(tag, payloads)| {
            (payloads.iter().enumerate()).map(|(i, p)| (*tag, i as u32, p.to_vec()))
        })
        .collect();
    assert_eq!(seen, expected);
    assert_eq!(
        Arc::strong_count(&observer),
        1,
        "the jobs let go of the observer"
    );
}
