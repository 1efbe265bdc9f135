//! One-task jobs through the scheduler alone, the same way every run: for counting the
//! scheduler's instructions per job with callgrind, without the threads, sockets and timing of
//! `flint-load` (whose count moves 2-4% from run to run with how many jobs happen to queue).
//!
//! `cargo run --release -p flint-engine --example one_task_jobs -- [IN_FLIGHT CORES FRAME] JOBS`:
//! one executor of CORES cores (default 64) and a service keeping IN_FLIGHT one-task jobs
//! (default 128) in flight, under the driver's default settings (hedging on), keeping no
//! results, as `flint-load` submits them. The executor reports FRAME results at a time
//! (default 16), each frame followed by as many new jobs, submitted as the driver does a burst
//! (launches held, then released). With more jobs in flight than cores, the rest wait in the
//! scheduler's queue. The marginal count between two JOBS (`valgrind --tool=callgrind`, then
//! the difference of the totals over the difference of the jobs) is the scheduler's cost per
//! job: `ci/cost`'s job.scheduler. (The bench crate's `scheduler_cost` example drives it the
//! same way for `ci/cost_growth`'s question, how the cost per task grows with the shape of the
//! work; this one asks what one-task jobs of a service cost when some wait in line.)

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;
use flint_engine::scheduler::{
    Config, Event, ExecutorId, ExecutorInfo, HedgeConfig, JobId, JobSpec, Output, Payloads,
    Scheduler, StatusUpdate, TaskId, TaskState, Tasks,
};

/// The arguments: `[IN_FLIGHT CORES FRAME] JOBS`.
fn args() -> [u64; 4] {
    let given: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| {
            a.parse()
                .unwrap_or_else(|_| panic!("argument {a:?} is no number"))
        })
        .collect();
    match given[..] {
        [] => [128, 64, 16, 10_000],
        [jobs] => [128, 64, 16, jobs],
        [in_flight, cores, frame, jobs] => [in_flight, cores, frame, jobs],
        _ => panic!("usage: one_task_jobs [IN_FLIGHT CORES FRAME] JOBS"),
    }
}

fn main() {
    let [in_flight, cores, frame, jobs] = args();
    let (in_flight, frame) = (in_flight.max(1), frame.max(1));
    let cores = u32::try_from(cores).unwrap_or(u32::MAX).max(1);
    let mut s = Scheduler::new(Config {
        hedging: Some(HedgeConfig::default()),
        exclusion: None,
        ..Config::default()
    });
    let executor = ExecutorId(1);
    let info = ExecutorInfo {
        id: executor,
        host: "host".into(),
        cores,
        attributes: Vec::new(),
    };
    s.handle_register(info, 0).expect("a fresh executor");
    let function: Arc<str> = Arc::from("noop");
    // One payload every job shares, as `flint-load` submits a one-task job's.
    let payload = Bytes::from(vec![0xA5; 16]);
    let job = || JobSpec {
        keep_results: false,
        ..JobSpec::new(Tasks::Same {
            function: function.clone(),
            cores: 1,
            payloads: Payloads::from(payload.clone()),
        })
    };
    let (mut submitted, mut ended, mut now) = (0u64, 0u64, 1u64);
    let mut running: VecDeque<(TaskId, u32)> = VecDeque::new();
    let (mut outputs, mut updates) = (Vec::new(), Vec::new());
    let submit = |s: &mut Scheduler, submitted: &mut u64, n: u64, now: u64| {
        s.hold_launches(now);
        for _ in 0..n {
            *submitted += 1;
            s.handle_submit_with_id(JobId(*submitted), job(), now)
                .expect("within the limits");
        }
        s.release_launches(now);
    };
    submit(&mut s, &mut submitted, in_flight.min(jobs), now);
    while ended < jobs {
        now += 10;
        s.drain_outputs(&mut outputs);
        for out in outputs.drain(..) {
            if let Output::Launch { tasks, .. } = out {
                running.extend(tasks.iter().map(|t| (t.task, t.attempt)));
                s.recycle_launches(tasks);
            }
        }
        let n = (frame as usize).min(running.len());
        updates.extend(running.drain(..n).map(|(task, attempt)| StatusUpdate {
            executor,
            task,
            attempt,
            state: TaskState::Finished,
            data: Bytes::new(),
        }));
        assert!(!updates.is_empty(), "jobs in flight with nothing running");
        s.handle_statuses(updates.drain(..), now);
        while let Some(event) = s.poll_event() {
            if let Event::JobOutcome { .. } | Event::OneTaskJobSucceeded { .. } = event {
                ended += 1;
            }
        }
        let more = (ended + in_flight).min(jobs) - submitted;
        submit(&mut s, &mut submitted, more, now);
    }
    println!("{jobs} jobs ended");
}
