//! What the driver's loop spends answering one `Observe` (the view the pages, the API and the
//! metrics render), with its records as full as they get: 2,048 timeline bars and the running
//! ones, 300 chart points, 100 active and 50 finished jobs with their samples, 50 failures, 16
//! executors. Prints the time per view (median of 7 rounds of 200). The HTTP server asks at
//! most once per 250 ms (`ui::VIEW_MAX_AGE`), so a loop spends at most 4 views a second.
//!
//! `cargo run --release -p flint-net --example view_cost`

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use flint_engine::scheduler::{ExecutorId, JobId, Stats, TaskId, TaskLaunch};
use flint_net::observe::LoopTelemetry;
use flint_net::wire::TaskState;

fn launch(task: TaskId, attempt: u32) -> TaskLaunch {
    TaskLaunch {
        task,
        attempt,
        function: Arc::from("noop"),
        payload: Bytes::new(),
        cores: 1,
        speculative: attempt > 0,
    }
}

/// A telemetry as full as a busy driver's.
fn busy() -> LoopTelemetry {
    let mut t = LoopTelemetry::new(Instant::now());
    for e in 0..16u64 {
        t.executor_registered(ExecutorId(e), &format!("exec-{e}"), "host", 2);
    }
    let mut now = 0;
    for job in 1..=150u64 {
        let id = JobId(job);
        t.job_submitted(now, id, Some(&Arc::from("noop")), 1_000_000, "default");
        for index in 0..4_000u32 {
            now += 1_000;
            let task = TaskId::new(id, index);
            let executor = ExecutorId(u64::from(index) % 16);
            t.launched(now, &launch(task, 0), executor, || index % 2);
            let state = if index % 97 == 0 {
                TaskState::Failed
            } else {
                TaskState::Finished
            };
            if index % 50 != 0 {
                t.status_update(now + 500, executor, task, 0, state, b"boom");
            }
            if t.point_due(now) {
                t.take_point(now, &Stats::default(), 100, 32);
            }
        }
        if job <= 50 {
            t.job_over(now, id, flint_net::observe::JobEnd::Succeeded);
        }
    }
    for s in 0..300u64 {
        t.take_point(now + s * 1_000_000, &Stats::default(), 100, 32);
    }
    t
}

fn main() {
    let t = busy();
    let view = t.view(|_| 2, |_| None, 1);
    println!(
        "records: {} bars, {} points, {} jobs, {} failures, {} executors",
        view.timeline.len(),
        view.series.len(),
        view.jobs.len(),
        view.failures.len(),
        view.executors.len()
    );
    let mut rounds: Vec<f64> = (0..7)
        .map(|_| {
            let started = Instant::now();
            for i in 0..200 {
                std::hint::black_box(t.view(|_| 2, |_| None, i));
            }
            started.elapsed().as_secs_f64() * 1e6 / 200.0
        })
        .collect();
    rounds.sort_by(f64::total_cmp);
    let us = rounds[3];
    println!(
        "one view: {us:.0} us (median of 7 rounds of 200); at most 4 a second: {:.3}% of one core",
        us * 4.0 / 1e6 * 100.0
    );
}
