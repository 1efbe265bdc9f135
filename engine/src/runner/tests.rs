//! Unit tests of the runner: inline and pooled runs, kills, refusals.

use super::*;
use crate::pool::{ShutdownMode, TaskPool, TaskPoolConfig};
use std::sync::atomic::AtomicUsize;
use std::time::Instant;

/// What a short inline run adds to its average at most, at the default threshold.
const COUNTED_MAX_NS: u64 = 2 * nanos(INLINE_RUN_MAX_DEFAULT);

/// A runner over a one-worker pool, and how many kicks it made. `slow_once` sleeps 3 ms
/// when its payload is `b"slow"`, else returns at once; `boom` panics.
fn runner(pool: &TaskPool) -> (TaskRunner, Arc<AtomicUsize>) {
    let kicks = Arc::new(AtomicUsize::new(0));
    let counter = kicks.clone();
    let kick: Kick = Arc::new(move || {
        counter.fetch_add(1, Ordering::SeqCst);
    });
    let mut registry = Registry::with_builtins();
    registry.register("boom", |_, _| panic!("boom"));
    registry.register("slow_once", |_, payload| {
        if payload == b"slow"[..] {
            std::thread::sleep(Duration::from_millis(3));
        }
        Ok(Bytes::new())
    });
    (TaskRunner::new(pool.handle(), registry, 64, kick), kicks)
}

fn pool() -> TaskPool {
    TaskPool::new(TaskPoolConfig {
        workers: 1,
        ..TaskPoolConfig::default()
    })
    .expect("pool")
}

fn launch(task: u64, function: &str, payload: &'static [u8]) -> TaskLaunch {
    TaskLaunch {
        task: TaskId(task),
        attempt: 0,
        function: Arc::from(function),
        payload: Bytes::from_static(payload),
        cores: 1,
        speculative: false,
    }
}

/// The index of `function`'s entry in the runner (resolved now if new).
fn entry(runner: &mut TaskRunner, function: &str) -> usize {
    (runner.functions)
        .find(&runner.registry, &Arc::from(function))
        .expect("registered")
}

/// Drains until `n` final completions came (the pool's finish asynchronously); returns
/// them, and whether any `Running` report came (only pool runs send one).
fn finals(runner: &mut TaskRunner, n: usize) -> (Vec<TaskReport>, bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let (mut done, mut running) = (Vec::new(), false);
    while done.len() < n {
        assert!(
            Instant::now() < deadline,
            "only {} of {n} completions",
            done.len()
        );
        let mut batch = Vec::new();
        runner.drain(&mut batch);
        for c in batch {
            match c.state {
                TaskState::Running => running = true,
                _ => done.push(c),
            }
        }
        std::thread::yield_now();
    }
    (done, running)
}

/// Whether one launch of `function` runs inline (it waits for the loop's drain, not on the
/// pool); waits for its end, which an inline run reaches in that very drain.
fn ran_inline(runner: &mut TaskRunner, task: u64, function: &str, payload: &'static [u8]) -> bool {
    runner.launch(launch(task, function, payload));
    let inline = runner.has_waiting();
    let (done, running) = finals(runner, 1);
    assert_eq!(done.len(), 1);
    assert!(!(inline && running), "an inline run reports no Running");
    inline
}

#[test]
fn a_known_short_function_runs_inline_and_a_slow_one_on_the_pool() {
    let mut pool = pool();
    let (mut runner, kicks) = runner(&pool);
    // Unknown timing: the first runs go to the pool.
    for i in 0..INLINE_RUNS_MIN {
        assert!(
            !ran_inline(&mut runner, i, "noop", b""),
            "run {i} is not inline"
        );
    }
    // Now known to be short: it completes in the next drain, on this thread, unkicked.
    let before = kicks.load(Ordering::SeqCst);
    assert!(ran_inline(&mut runner, 100, "noop", b""));
    assert_eq!(
        kicks.load(Ordering::SeqCst),
        before,
        "no kick for an inline run"
    );
    // A slow function never qualifies.
    for i in 0..INLINE_RUNS_MIN + 1 {
        assert!(!ran_inline(&mut runner, 200 + i, "sleep:1", b""));
    }
    pool.shutdown(ShutdownMode::Drain);
}

#[test]
fn an_inline_panic_fails_its_attempt_and_the_loop_goes_on() {
    let mut pool = pool();
    let (mut runner, _kicks) = runner(&pool);
    let index = entry(&mut runner, "boom");
    for _ in 0..INLINE_RUNS_MIN {
        runner.functions.entries[index].ran_inline(1_000, COUNTED_MAX_NS);
    }
    runner.launch(launch(7, "boom", b""));
    let mut done = Vec::new();
    runner.drain(&mut done);
    assert_eq!(done.len(), 1, "inline: done in the same drain");
    assert_eq!(done[0].state, TaskState::Failed);
    assert_eq!(&done[0].data[..], b"task panicked: boom");
    pool.shutdown(ShutdownMode::Drain);
}

#[test]
fn two_long_inline_runs_in_a_row_send_the_function_to_the_pool_for_a_while() {
    let mut pool = pool();
    let (mut runner, _kicks) = runner(&pool);
    for i in 0..INLINE_RUNS_MIN {
        assert!(!ran_inline(&mut runner, i, "slow_once", b""));
    }
    assert!(ran_inline(&mut runner, 10, "slow_once", b""));
    // One run over INLINE_RUN_GIVE_UP (a preempted run looks the same): still inline.
    assert!(ran_inline(&mut runner, 11, "slow_once", b"slow"));
    assert!(
        ran_inline(&mut runner, 12, "slow_once", b""),
        "one long run is forgiven"
    );
    // Two in a row: it sits out SIT_OUT_RUNS runs on the pool, then comes back.
    assert!(ran_inline(&mut runner, 13, "slow_once", b"slow"));
    assert!(ran_inline(&mut runner, 14, "slow_once", b"slow"));
    for i in 0..SIT_OUT_RUNS {
        let inline = ran_inline(&mut runner, 100 + i, "slow_once", b"");
        assert!(!inline, "sits out run {i}");
    }
    assert!(
        ran_inline(&mut runner, 200, "slow_once", b""),
        "back inline"
    );
    // The second time, twice as long.
    assert!(ran_inline(&mut runner, 201, "slow_once", b"slow"));
    assert!(ran_inline(&mut runner, 202, "slow_once", b"slow"));
    for i in 0..2 * SIT_OUT_RUNS {
        let inline = ran_inline(&mut runner, 300 + i, "slow_once", b"");
        assert!(!inline, "sits out run {i} of twice as many");
    }
    assert!(
        ran_inline(&mut runner, 400, "slow_once", b""),
        "back inline"
    );
    pool.shutdown(ShutdownMode::Drain);
}

#[test]
fn a_higher_inline_threshold_runs_a_longer_function_inline() {
    let mut pool = pool();
    let (mut runner, _kicks) = runner(&pool);
    let index = entry(&mut runner, "slow_once");
    for _ in 0..INLINE_RUNS_MIN {
        runner.functions.entries[index].timing.record(50_000);
    }
    // 50 us on average: the pool's at the default threshold (its own quick run leaves the
    // average over 40 us)...
    runner.launch(launch(1, "slow_once", b""));
    assert!(!runner.has_waiting(), "on the pool");
    let (done, _) = finals(&mut runner, 1);
    assert_eq!(done[0].state, TaskState::Finished);
    // ...inline under a threshold of 100 us (a lane's).
    runner.set_inline_max(Duration::from_micros(100));
    assert!(ran_inline(&mut runner, 2, "slow_once", b""));
    pool.shutdown(ShutdownMode::Drain);
}

#[test]
fn a_stretched_inline_run_does_not_make_a_short_function_look_long() {
    let mut pool = pool();
    let (mut runner, _kicks) = runner(&pool);
    for i in 0..INLINE_RUNS_MIN {
        assert!(!ran_inline(&mut runner, i, "slow_once", b""));
    }
    let index = entry(&mut runner, "slow_once");
    // A run of 1.5 ms (under the give-up, over the threshold: a preemption, say) would
    // take the average over 20 us if counted whole.
    assert_eq!(
        runner.functions.entries[index].ran_inline(1_500_000, COUNTED_MAX_NS),
        None
    );
    assert!(ran_inline(&mut runner, 10, "slow_once", b""), "still short");
    pool.shutdown(ShutdownMode::Drain);
}

#[test]
fn a_drain_runs_inline_work_for_its_round_and_the_rest_waits_for_the_next() {
    let mut pool = pool();
    let (mut runner, _kicks) = runner(&pool);
    for i in 0..INLINE_RUNS_MIN {
        assert!(!ran_inline(&mut runner, i, "noop", b""));
    }
    // A round of zero: one run per drain.
    runner.set_inline_round(Duration::ZERO);
    for i in 0..3 {
        runner.launch(launch(100 + i, "noop", b""));
    }
    for left in [2, 1, 0] {
        let mut done = Vec::new();
        runner.drain(&mut done);
        assert_eq!(done.len(), 1);
        assert_eq!(runner.has_waiting(), left > 0);
    }
    pool.shutdown(ShutdownMode::Drain);
}

#[test]
fn a_waiting_attempt_killed_never_runs_and_a_refused_one_fails_at_once() {
    let mut pool = pool();
    let (mut runner, _kicks) = runner(&pool);
    let index = entry(&mut runner, "boom");
    for _ in 0..INLINE_RUNS_MIN {
        runner.functions.entries[index].ran_inline(1_000, COUNTED_MAX_NS);
    }
    runner.launch(launch(7, "boom", b""));
    assert!(runner.kill(Attempt::new(TaskId(7), 0)));
    let mut done = Vec::new();
    runner.drain(&mut done);
    assert_eq!(done.len(), 1);
    assert_eq!(
        (done[0].state, &done[0].data[..]),
        (TaskState::Killed, &b"killed before it started"[..])
    );
    // A pool that is shut down refuses: the attempt fails in the next drain.
    pool.shutdown(ShutdownMode::Drain);
    runner.launch(launch(8, "sleep:1", b""));
    let mut done = Vec::new();
    runner.drain(&mut done);
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].state, TaskState::Failed);
    assert!(String::from_utf8_lossy(&done[0].data).starts_with("not run: the task pool refused it"));
}

/// The pool's finished tasks once they are at least `n` (a worker counts a task after its
/// reports are out), waiting up to 10 s.
fn pool_tasks(pool: &TaskPool, n: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let finished = pool.stats().finished;
        if finished >= n || Instant::now() >= deadline {
            return finished;
        }
        std::thread::yield_now();
    }
}

#[test]
fn short_pool_runs_go_in_batches_each_ending_alone_and_a_gathered_kill_never_runs() {
    let mut pool = TaskPool::new(TaskPoolConfig {
        workers: 2,
        ..TaskPoolConfig::default()
    })
    .expect("pool");
    let (mut runner, kicks) = runner(&pool);
    runner.set_inline(false);
    runner.set_pool_batches(Duration::from_micros(100));
    // Unknown timing: the first runs go to the pool one by one.
    for i in 0..INLINE_RUNS_MIN {
        let tasks_before = pool.stats().finished;
        runner.launch(launch(i, "noop", b""));
        assert_eq!(finals(&mut runner, 1).0[0].state, TaskState::Finished);
        assert_eq!(
            pool_tasks(&pool, tasks_before + 1),
            tasks_before + 1,
            "a task of its own"
        );
    }
    let index = entry(&mut runner, "boom");
    for _ in 0..INLINE_RUNS_MIN {
        runner.functions.entries[index].timing.record(1_000);
    }
    let (tasks_before, kicks_before) = (pool.stats().finished, kicks.load(Ordering::SeqCst));
    for task in 100..110 {
        let function = if task == 104 { "boom" } else { "noop" };
        runner.launch(launch(task, function, b""));
    }
    assert_eq!(runner.running(), 10, "gathered until the drain");
    assert!(runner.kill(Attempt::new(TaskId(107), 0)), "a gathered one");
    let (mut done, _) = finals(&mut runner, 10);
    done.sort_by_key(|r| r.task);
    for report in &done {
        let expected = match report.task.0 {
            104 => (TaskState::Failed, &b"task panicked: boom"[..]),
            107 => (TaskState::Killed, &b"killed before it started"[..]),
            _ => (TaskState::Finished, &b""[..]),
        };
        assert_eq!(
            (report.state, &report.data[..]),
            expected,
            "{:?}",
            report.task
        );
    }
    let ended: Vec<u64> = done.iter().map(|r| r.task.0).collect();
    assert_eq!(ended, (100..110).collect::<Vec<_>>(), "each once");
    // Nine runs over two workers: two pool tasks, each kicking once at most.
    assert_eq!(pool_tasks(&pool, tasks_before + 2), tasks_before + 2);
    assert!(kicks.load(Ordering::SeqCst) - kicks_before <= 2);
    assert_eq!(runner.running(), 0);
    pool.shutdown(ShutdownMode::Drain);
}

#[test]
fn a_batch_the_pool_refuses_fails_every_run_at_once() {
    let mut pool = pool();
    let (mut runner, _kicks) = runner(&pool);
    runner.set_inline(false);
    runner.set_pool_batches(Duration::from_micros(100));
    let index = entry(&mut runner, "noop");
    for _ in 0..INLINE_RUNS_MIN {
        runner.functions.entries[index].timing.record(1_000);
    }
    pool.shutdown(ShutdownMode::Drain);
    for task in 0..3 {
        runner.launch(launch(task, "noop", b""));
    }
    let mut done = Vec::new();
    runner.drain(&mut done);
    assert_eq!(done.len(), 3, "failed in the same drain");
    for report in &done {
        assert_eq!(report.state, TaskState::Failed);
        let why = String::from_utf8_lossy(&report.data);
        assert!(
            why.starts_with("not run: the task pool refused it"),
            "{why}"
        );
    }
    assert_eq!(runner.running(), 0);
}

#[test]
fn a_gathered_run_whose_function_entry_was_replaced_in_its_round_runs_its_own_function() {
    let mut pool = pool();
    let kick: Kick = Arc::new(|| {});
    let mut registry = Registry::new();
    let names: Vec<String> = (0..=FUNCTIONS_MAX).map(|i| format!("f{i}")).collect();
    for name in &names {
        let result = Bytes::from(name.clone());
        registry.register(name, move |_, _| Ok(result.clone()));
    }
    let mut runner = TaskRunner::new(pool.handle(), registry, 256, kick);
    runner.set_inline(false);
    runner.set_pool_batches(Duration::from_micros(100));
    // Every entry known to be short; then a round of their runs and one of a new function,
    // whose entry replaces the oldest while the others wait to be sent.
    for name in &names[..FUNCTIONS_MAX] {
        let index = entry(&mut runner, name);
        for _ in 0..INLINE_RUNS_MIN {
            runner.functions.entries[index].timing.record(1_000);
        }
    }
    for (task, name) in names.iter().enumerate() {
        let mut l = launch(task as u64, "", b"");
        l.function = Arc::from(name.as_str());
        runner.launch(l);
    }
    let (done, _) = finals(&mut runner, names.len());
    for report in &done {
        assert_eq!(report.state, TaskState::Finished, "{:?}", report.task);
        let expected = format!("f{}", report.task.0);
        assert_eq!(&report.data[..], expected.as_bytes(), "its own function");
    }
    pool.shutdown(ShutdownMode::Drain);
}
