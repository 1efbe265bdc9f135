//! Behaviour of the task pool: many producers with backpressure, panic isolation, bounded
//! inboxes, placement, stealing, drain and cancel on shutdown.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{unbounded, Receiver, Sender};
use flint_engine::pool::{
    PoolError, ShutdownMode, Submitted, Task, TaskOutcome, TaskPool, TaskPoolConfig,
};

const DEADLINE: Duration = Duration::from_secs(10);

fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + DEADLINE;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn pool(workers: usize, inbox_capacity: usize) -> TaskPool {
    TaskPool::new(TaskPoolConfig {
        workers,
        inbox_capacity,
        ..Default::default()
    })
    .expect("pool")
}

/// A task that blocks its worker until `release` gets a message (or the deadline).
fn blocker(started: Sender<()>, release: Receiver<()>) -> impl FnOnce() + Send + 'static {
    move || {
        started.send(()).unwrap();
        let _ = release.recv_timeout(DEADLINE);
    }
}

#[test]
fn stress_many_producers_with_backpressure_run_every_task_once() {
    const PRODUCERS: usize = 6;
    const PER: usize = 20_000;
    let pool = pool(2, 16);
    let done = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..PRODUCERS)
        .map(|_| {
            let handle = pool.handle();
            let done = done.clone();
            std::thread::spawn(move || {
                for _ in 0..PER {
                    let done = done.clone();
                    handle
                        .submit(Task::new(move || {
                            done.fetch_add(1, Ordering::Relaxed);
                        }))
                        .expect("submit blocks instead of failing");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    wait_until("all tasks ran", || {
        done.load(Ordering::Relaxed) == PRODUCERS * PER
    });
    wait_until("stats", || {
        pool.stats().finished == (PRODUCERS * PER) as u64
    });
    assert_eq!(pool.stats().failed, 0);
}

#[test]
fn panicking_task_is_reported_failed_and_worker_survives() {
    let pool = pool(1, 8);
    let (tx, rx) = unbounded();
    let tx2 = tx.clone();
    pool.submit(Task::with_completion(
        || panic!("task exploded"),
        move |o| tx.send(o).unwrap(),
    ))
    .unwrap();
    assert_eq!(
        rx.recv_timeout(DEADLINE).unwrap(),
        TaskOutcome::Failed("task exploded".into())
    );
    pool.submit(Task::with_completion(|| {}, move |o| tx2.send(o).unwrap()).on_core(0))
        .unwrap();
    assert_eq!(rx.recv_timeout(DEADLINE).unwrap(), TaskOutcome::Finished);
    wait_until("stats", || {
        pool.stats().failed == 1 && pool.stats().finished == 1
    });
}

#[test]
fn try_submit_reports_full_and_returns_the_task() {
    let pool = pool(1, 2);
    let (started_tx, started_rx) = unbounded();
    let (release_tx, release_rx) = unbounded();
    pool.submit(Task::new(blocker(started_tx, release_rx)))
        .unwrap();
    started_rx.recv_timeout(DEADLINE).unwrap();
    let mut accepted = 0;
    let rejected = loop {
        match pool.try_submit(Task::new(|| {}).on_core(0)) {
            Ok(Submitted { core }) => {
                assert_eq!(core, 0);
                accepted += 1;
                assert!(accepted <= 2 + 32, "bounded");
            }
            Err(r) => break r,
        }
    };
    assert_eq!(rejected.error, PoolError::Full { core: Some(0) });
    // The rejected task comes back; dropping it unrun reports Cancelled.
    let (tx, rx) = unbounded();
    let mine = Task::with_completion(|| {}, move |o| tx.send(o).unwrap()).on_core(0);
    let back = pool.try_submit(mine).unwrap_err();
    assert_eq!(back.task.core(), Some(0));
    drop(back);
    assert_eq!(rx.recv_timeout(DEADLINE).unwrap(), TaskOutcome::Cancelled);
    release_tx.send(()).unwrap();
}

#[test]
fn submit_reports_the_requested_core_and_rejects_unknown_cores() {
    let pool = pool(2, 8);
    assert_eq!(pool.submit(Task::new(|| {}).on_core(1)).unwrap().core, 1);
    assert_eq!(
        pool.try_submit(Task::new(|| {}).on_core(0)).unwrap().core,
        0
    );
    let err = pool.try_submit(Task::new(|| {}).on_core(2)).unwrap_err();
    assert_eq!(err.error, PoolError::NoSuchCore(2));
}

#[test]
fn idle_worker_steals_work_queued_on_a_busy_one() {
    let pool = pool(2, 64);
    let (started_tx, started_rx) = unbounded();
    let (release_tx, release_rx) = unbounded();
    pool.submit(Task::new(blocker(started_tx, release_rx)).on_core(0))
        .unwrap();
    started_rx.recv_timeout(DEADLINE).unwrap();
    let done = Arc::new(AtomicUsize::new(0));
    for _ in 0..20 {
        let done = done.clone();
        pool.submit(
            Task::new(move || {
                done.fetch_add(1, Ordering::SeqCst);
            })
            .on_core(0),
        )
        .unwrap();
    }
    // Worker 0 is still blocked: only worker 1 can have run these.
    wait_until("stolen tasks ran", || done.load(Ordering::SeqCst) == 20);
    release_tx.send(()).unwrap();
}

fn queue_behind_blocker(
    pool: &TaskPool,
    n: usize,
) -> (Sender<()>, Receiver<TaskOutcome>, Receiver<TaskOutcome>) {
    let (started_tx, started_rx) = unbounded();
    let (release_tx, release_rx) = unbounded();
    let (blocker_tx, blocker_rx) = unbounded();
    pool.submit(Task::with_completion(
        blocker(started_tx, release_rx),
        move |o| blocker_tx.send(o).unwrap(),
    ))
    .unwrap();
    started_rx.recv_timeout(DEADLINE).unwrap();
    let (tx, rx) = unbounded();
    for _ in 0..n {
        let tx = tx.clone();
        pool.submit(Task::with_completion(|| {}, move |o| tx.send(o).unwrap()).on_core(0))
            .unwrap();
    }
    (release_tx, blocker_rx, rx)
}

/// Releases the blocker once the pool refuses submissions (shutdown has begun). Returns how
/// many of its probes the pool accepted before that (they count in the pool's stats too).
fn release_when_closed(pool: &TaskPool, release: Sender<()>) -> std::thread::JoinHandle<u64> {
    let handle = pool.handle();
    std::thread::spawn(move || {
        let mut accepted = 0;
        wait_until("shutdown begun", || match handle.spawn(|| {}) {
            Err(r) => r.error == PoolError::Shutdown,
            Ok(_) => {
                accepted += 1;
                false
            }
        });
        release.send(()).unwrap();
        accepted
    })
}

#[test]
fn shutdown_drain_runs_queued_tasks() {
    let mut pool = pool(1, 64);
    let (release, blocker_rx, rx) = queue_behind_blocker(&pool, 10);
    let releaser = release_when_closed(&pool, release);
    pool.shutdown(ShutdownMode::Drain);
    let probes = releaser.join().unwrap();
    assert_eq!(blocker_rx.try_recv().unwrap(), TaskOutcome::Finished);
    let outcomes: Vec<_> = rx.try_iter().collect();
    assert_eq!(outcomes, vec![TaskOutcome::Finished; 10]);
    assert_eq!(pool.stats().finished, 11 + probes);
    let err = pool.try_submit(Task::new(|| {})).unwrap_err();
    assert_eq!(err.error, PoolError::Shutdown);
}

#[test]
fn shutdown_cancel_reports_queued_tasks_cancelled() {
    let mut pool = pool(1, 64);
    let (release, blocker_rx, rx) = queue_behind_blocker(&pool, 10);
    let releaser = release_when_closed(&pool, release);
    pool.shutdown(ShutdownMode::Cancel);
    let probes = releaser.join().unwrap();
    assert_eq!(blocker_rx.try_recv().unwrap(), TaskOutcome::Finished);
    let outcomes: Vec<_> = rx.try_iter().collect();
    assert_eq!(outcomes, vec![TaskOutcome::Cancelled; 10]);
    assert_eq!(pool.stats().cancelled, 10 + probes);
}

#[test]
fn drop_shuts_down_and_drains() {
    let done = Arc::new(AtomicUsize::new(0));
    {
        let pool = pool(2, 1024);
        for _ in 0..500 {
            let done = done.clone();
            pool.submit(Task::new(move || {
                done.fetch_add(1, Ordering::SeqCst);
            }))
            .unwrap();
        }
    }
    assert_eq!(done.load(Ordering::SeqCst), 500);
}
