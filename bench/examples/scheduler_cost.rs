//! Drives the scheduler state machine alone, in one thread, the way the driver does (launches
//! out and their vectors handed back, every launched attempt finished at once, each
//! executor's reports as one batch of status updates, as its frame would bring them), for counting
//! its instructions per task with callgrind as the shape of the work grows (`ci/cost_growth`
//! runs it at two sizes and takes the marginal, as `ci/cost` does):
//!
//! ```sh
//! cargo build --release -p flint-bench --example scheduler_cost
//! valgrind --tool=callgrind ./target/release/examples/scheduler_cost \
//!     --tasks 200000 --tasks-per-job 1000 --active-jobs 1000 --executors 100
//! ```
//!
//! - `--tasks N`: tasks run in all (the measured work);
//! - `--tasks-per-job T`: the measured tasks come as jobs of T tasks, one after another;
//! - `--active-jobs A`: A other jobs stay active the whole time, behind the measured ones in
//!   FIFO order (lower priority), each with one task too big for any executor, so they are
//!   never launched and never end (the scheduler's ordered sets and timers hold them);
//! - `--executors E`: E executors of 16 slots each take the work, all in this thread.

use bytes::Bytes;
use flint_engine::scheduler::{
    Config, Event, ExecutorId, ExecutorInfo, JobSpec, Output, Scheduler, StatusUpdate, TaskSpec,
    TaskState, Tasks,
};

/// Slots per executor.
const SLOTS: u32 = 16;

struct Shape {
    tasks: u64,
    tasks_per_job: u64,
    active_jobs: u64,
    executors: u64,
}

fn parse() -> Result<Shape, String> {
    let mut shape = Shape {
        tasks: 100_000,
        tasks_per_job: 1_000,
        active_jobs: 0,
        executors: 1,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value: u64 = args
            .next()
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("{flag} takes a whole number"))?;
        match flag.as_str() {
            "--tasks" => shape.tasks = value,
            "--tasks-per-job" => shape.tasks_per_job = value.max(1),
            "--active-jobs" => shape.active_jobs = value,
            "--executors" => shape.executors = value.max(1),
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    Ok(shape)
}

/// A job of `n` no-op tasks of one function (as a driver submits one).
fn job(n: u64, cores: u32, priority: i32) -> JobSpec {
    JobSpec {
        priority,
        keep_results: false,
        ..JobSpec::new(Tasks::Same {
            function: "noop".into(),
            cores,
            payloads: vec![Bytes::new(); n as usize].into(),
        })
    }
}

/// What the driver's core does with the scheduler's outputs, cheaply: each launch batch's
/// attempts finish at once (their reports wait for the next round, one batch per executor,
/// as its frame would bring them) and the batch's vector goes back to the scheduler.
#[derive(Default)]
struct Io {
    outputs: Vec<Output>,
    /// Per executor launched to: its reports.
    reports: Vec<Vec<StatusUpdate>>,
    /// The last round's `reports`, emptied.
    emptied: Vec<Vec<StatusUpdate>>,
    /// Emptied report batches, for reuse.
    spare: Vec<Vec<StatusUpdate>>,
    /// Results seen.
    done: u64,
}

impl Io {
    /// Carries out what the scheduler decided after an input (the driver's `pump`).
    fn carry(&mut self, s: &mut Scheduler) {
        s.drain_outputs(&mut self.outputs);
        for output in self.outputs.drain(..) {
            match output {
                Output::Launch { executor, tasks } => {
                    let mut batch = self.spare.pop().unwrap_or_default();
                    batch.extend(tasks.iter().map(|t| StatusUpdate {
                        executor,
                        task: t.task,
                        attempt: t.attempt,
                        state: TaskState::Finished,
                        data: Bytes::new(),
                    }));
                    self.reports.push(batch);
                    s.recycle_launches(tasks);
                }
                Output::Event(Event::TaskResult { .. } | Event::OneTaskJobSucceeded { .. }) => {
                    self.done += 1
                }
                Output::Kill { .. } | Output::Event(Event::JobOutcome { .. }) => {}
            }
        }
    }
}

fn main() -> Result<(), String> {
    let shape = parse()?;
    let mut s = Scheduler::new(Config {
        jobs_max: shape.active_jobs as usize + 16,
        executors_max: shape.executors as usize,
        pending_tasks_max: usize::MAX,
        ..Config::default()
    });
    let mut now_us = 0u64;
    for e in 0..shape.executors {
        let info = ExecutorInfo {
            id: ExecutorId(e + 1),
            host: format!("h{}", e % 64),
            cores: SLOTS,
            attributes: Vec::new(),
        };
        s.handle_register(info, now_us).map_err(|e| e.to_string())?;
    }
    for _ in 0..shape.active_jobs {
        let too_big = JobSpec::new(vec![TaskSpec {
            cores: SLOTS + 1,
            ..TaskSpec::new("noop", Bytes::new())
        }]);
        s.handle_submit(
            JobSpec {
                priority: -1,
                ..too_big
            },
            now_us,
        )
        .map_err(|e| e.to_string())?;
    }
    let mut io = Io::default();
    let mut submitted = 0u64;
    while io.done < shape.tasks {
        // Enough queued to fill every executor's slots (and no more: the measured work).
        let slots = shape.executors * u64::from(SLOTS);
        if submitted < shape.tasks && (s.pending_tasks() as u64) < slots {
            let n = shape.tasks_per_job.min(shape.tasks - submitted);
            s.handle_submit(job(n, 1, 0), now_us)
                .map_err(|e| e.to_string())?;
            submitted += n;
            io.carry(&mut s);
        }
        now_us += 10;
        // This round's reports; the next round's gather in the emptied vector of the last.
        let mut reports = std::mem::replace(&mut io.reports, std::mem::take(&mut io.emptied));
        if reports.is_empty() {
            s.handle_timeout(now_us);
            io.carry(&mut s);
        }
        for mut batch in reports.drain(..) {
            s.handle_statuses(batch.drain(..), now_us);
            io.spare.push(batch);
            io.carry(&mut s);
        }
        io.emptied = reports;
    }
    println!(
        "{} tasks in jobs of {}, {} other jobs active, {} executors",
        shape.tasks, shape.tasks_per_job, shape.active_jobs, shape.executors
    );
    Ok(())
}
