//! Unit tests of the scheduler's internal bookkeeping (its behaviour through the public API
//! is tested in `engine/tests/scheduler.rs`).

use bytes::Bytes;

use super::*;

fn spec(n: usize) -> JobSpec {
    let tasks: Vec<TaskSpec> = (0..n)
        .map(|i| TaskSpec::new("f", Bytes::from(vec![i as u8])))
        .collect();
    JobSpec::new(tasks)
}

fn executor(id: u64, cores: u32) -> ExecutorInfo {
    ExecutorInfo {
        id: ExecutorId(id),
        host: "h".into(),
        cores,
        attributes: Vec::new(),
    }
}

/// A scheduler with executor 1 registered with `slots` slots, all usable at once.
fn with_executor(slots: u32) -> Scheduler {
    let mut s = Scheduler::new(Config {
        slow_start_slots: slots,
        ..Config::default()
    });
    s.handle_register(executor(1, slots), 0)
        .expect("registered");
    s
}

/// The tasks launched by the outputs emitted so far.
fn launched(s: &mut Scheduler) -> usize {
    launch_batches(s).into_iter().sum()
}

#[test]
fn a_job_launched_whole_at_submission_enters_neither_the_order_nor_the_timers() {
    let mut s = with_executor(4);
    s.handle_submit(spec(1), 10).expect("accepted");
    assert_eq!(launched(&mut s), 1);
    assert_eq!((s.runnable.len(), s.timers.lens()), (0, (0, 0)));
    // One that does not fit whole is listed after its offers, with no unschedulable clock:
    // nothing may leave it stuck (its tasks fit the executor, nothing is excluded).
    s.handle_submit(spec(5), 20).expect("accepted");
    assert_eq!(launched(&mut s), 3, "the executor's free slots");
    assert_eq!((s.runnable.len(), s.timers.lens()), (1, (0, 0)));
    let listed = s.unlisted_new;
    assert_eq!(listed, None, "nothing left unlisted after a submission");
    // With a job listed, the next one is listed before its offers (and waits behind it).
    s.handle_submit(spec(1), 30).expect("accepted");
    assert_eq!(launched(&mut s), 0, "no free slot");
    assert_eq!((s.runnable.len(), s.timers.lens()), (2, (0, 0)));
}

#[test]
fn a_job_submitted_with_no_executor_is_listed_and_runs_when_one_comes() {
    let mut s = Scheduler::new(Config::default());
    s.handle_submit(spec(2), 0).expect("accepted");
    assert_eq!(launched(&mut s), 0);
    assert_eq!(s.runnable.len(), 1);
    s.handle_register(executor(1, 2), 10).expect("registered");
    assert!(
        launched(&mut s) > 0,
        "the listed job is found by the new executor's offer"
    );
}

/// The `Output::Launch`es emitted so far, as (executor, its launches); other outputs are
/// dropped.
fn launch_outputs(s: &mut Scheduler) -> Vec<(ExecutorId, Vec<TaskLaunch>)> {
    let mut outs = Vec::new();
    s.drain_outputs(&mut outs);
    (outs.into_iter())
        .filter_map(|o| match o {
            Output::Launch { executor, tasks } => Some((executor, tasks)),
            _ => None,
        })
        .collect()
}

/// The launches of each `Output::Launch` emitted, in tasks.
fn launch_batches(s: &mut Scheduler) -> Vec<usize> {
    (launch_outputs(s).iter())
        .map(|(_, tasks)| tasks.len())
        .collect()
}

/// A report that `key` finished on executor 1 (with no result).
fn finished_on_1(key: Attempt) -> StatusUpdate {
    StatusUpdate {
        executor: ExecutorId(1),
        task: key.task,
        attempt: key.attempt,
        state: TaskState::Finished,
        data: Bytes::new(),
    }
}

/// Executor 1's running attempts.
fn runs_on_1(s: &Scheduler) -> &runs::Runs {
    let slot = s.book.slot_of(ExecutorId(1)).expect("registered");
    &s.book.get(slot).expect("an executor").running
}

/// The attempts executor 1 runs, sorted.
fn running_on_1(s: &Scheduler) -> Vec<Attempt> {
    let mut running: Vec<Attempt> = runs_on_1(s).iter().map(|(key, _)| *key).collect();
    running.sort();
    running
}

#[test]
fn held_launches_of_a_burst_leave_as_one_batch_and_any_other_input_emits_them() {
    let mut s = with_executor(8);
    s.hold_launches(0);
    for at in 1..=3 {
        s.handle_submit(spec(1), at).expect("accepted");
    }
    assert_eq!(launch_batches(&mut s), Vec::<usize>::new(), "held");
    s.release_launches(0);
    assert_eq!(launch_batches(&mut s), [3], "one batch for the burst");
    // Unreleased, they still leave with the next input's launches.
    s.hold_launches(0);
    s.handle_submit(spec(1), 10).expect("accepted");
    s.handle_submit(spec(1), 11).expect("accepted");
    assert!(s.handle_cancel(JobId(1), 12), "a job of the first burst");
    assert_eq!(launch_batches(&mut s), [2]);
    // Not holding: one batch per submission, as before.
    s.release_launches(0);
    s.handle_submit(spec(1), 20).expect("accepted");
    s.handle_submit(spec(1), 21).expect("accepted");
    assert_eq!(launch_batches(&mut s), [1, 1]);
}

/// A job of one function over payloads of a million tasks.
fn same(n: usize) -> JobSpec {
    JobSpec::new(Tasks::Same {
        function: "f".into(),
        cores: 1,
        payloads: (0..n).map(|_| Bytes::from_static(b"p")).collect(),
    })
}

fn job_at(s: &Scheduler, id: JobId) -> &Job {
    let slot = s.job_slots.get(id.0).copied().expect("an active job");
    s.jobs.get(slot as usize).expect("a job in its slot")
}

/// `out`, with an [`Event::OneTaskJobSucceeded`] as the result and the outcome it stands for.
fn split(out: Output) -> Vec<Output> {
    match out {
        Output::Event(event) => event.split().map(Output::Event).collect(),
        other => vec![other],
    }
}

/// The outcome of `job` among the events emitted so far (others dropped).
fn outcome_of(s: &mut Scheduler, job: JobId) -> Option<JobOutcome> {
    let mut found = None;
    while let Some(event) = s.poll_event() {
        for event in event.split() {
            if let Event::JobOutcome { job: j, outcome } = event {
                if j == job {
                    found = Some(outcome);
                }
            }
        }
    }
    found
}

#[test]
fn a_job_built_over_an_ended_jobs_record_starts_afresh() {
    let mut s = with_executor(4);
    // A job whose task fails for good: failed, with a reason, its other task killed.
    let mut failing = spec(2);
    failing.max_failures = Some(1);
    let first = s.handle_submit(failing, 0).expect("accepted");
    let slot = s.job_slots.get(first.0).copied().expect("an active job");
    assert_eq!(launched(&mut s), 2);
    let failed = StatusUpdate {
        state: TaskState::Failed,
        data: Bytes::from_static(b"boom"),
        ..finished_on_1(Attempt::new(TaskId::new(first, 0), 0))
    };
    s.handle_status(failed, 1);
    let o = outcome_of(&mut s, first);
    assert!(
        matches!(&o, Some(JobOutcome::Failed(r)) if !r.is_empty()),
        "{o:?}"
    );
    assert!(s.jobs.get(slot as usize).is_none(), "its record is vacant");
    // The next job is built over that record: nothing of the failed one shows.
    let second = s.handle_submit(spec(1), 2).expect("accepted");
    assert_eq!(
        s.job_slots.get(second.0).copied(),
        Some(slot),
        "the same slot"
    );
    let info = s.job_info(second).expect("an active job");
    assert_eq!(
        (info.tasks, info.pending, info.running, info.finished),
        (1, 0, 1, 0)
    );
    assert_eq!((info.launched, info.failures, info.max_failures), (1, 0, 4));
    assert_eq!(launched(&mut s), 1);
    s.handle_status(finished_on_1(Attempt::new(TaskId::new(second, 0), 0)), 3);
    assert!(
        matches!(outcome_of(&mut s, second), Some(JobOutcome::Succeeded(_))),
        "a success, with no reason left from the failed job"
    );
}

#[test]
fn a_job_of_one_function_over_payloads_builds_a_task_record_when_the_task_first_leaves() {
    let mut s = Scheduler::new(Config {
        slow_start_slots: 4,
        ..Config::default()
    });
    let job = s.handle_submit(same(1_000_000), 0).expect("accepted");
    assert_eq!(
        job_at(&s, job).tasks.len(),
        0,
        "no record built at submission"
    );
    s.handle_register(executor(1, 4), 10).expect("registered");
    assert_eq!(launched(&mut s), 4);
    assert_eq!(
        job_at(&s, job).tasks.len(),
        4,
        "one record per task launched"
    );
    // Killing a task far ahead builds the records up to it; it is then passed over.
    assert!(s.handle_kill(TaskId::new(job, 9), "not needed", 20));
    assert_eq!(job_at(&s, job).tasks.len(), 10);
    let info = s.job_info(job).expect("active");
    assert_eq!((info.tasks, info.pending), (1_000_000, 1_000_000 - 5));
    let unbuilt = s.task_info(TaskId::new(job, 999_999)).expect("a task");
    assert_eq!(
        (unbuilt.status, unbuilt.attempts_launched),
        (TaskStatus::Pending, 0)
    );
    assert!(
        s.task_info(TaskId::new(job, 1_000_000)).is_none(),
        "beyond the job"
    );
    // Cancelling counts the unbuilt tasks out with the rest.
    assert!(s.handle_cancel(job, 30));
    assert_eq!((s.pending_tasks(), s.unfinished_tasks()), (0, 0));
}

#[test]
fn a_task_record_holds_no_payload_and_stays_small() {
    // A job of millions keeps millions of them (its payloads are the job's, as they came).
    assert!(std::mem::size_of::<TaskRec>() <= 56);
}

#[test]
fn speculation_timeouts_count_the_common_one_apart_and_the_least_with_jobs_decides() {
    let mut t = speculation::SpecTimeouts::new(100);
    assert_eq!(t.least(), None);
    t.add(100);
    t.add(50);
    t.add(300);
    assert_eq!(t.least(), Some(50));
    t.remove(50);
    assert_eq!(
        t.least(),
        Some(100),
        "a timeout left at zero jobs is passed over"
    );
    t.remove(100);
    assert_eq!(t.least(), Some(300));
    t.remove(300);
    assert_eq!(t.least(), None);
    // Others left at zero are kept up to a bound, then let go.
    for timeout in 1_000..1_020 {
        t.add(timeout);
        t.remove(timeout);
    }
    assert_eq!(t.least(), None);
    assert!(t.others_len() <= 9, "bounded: {}", t.others_len());
}

/// Runs every task of the scheduler's jobs on executor 1 to success, answering launches until
/// none come.
fn finish_all(s: &mut Scheduler, now_us: u64) {
    loop {
        let updates: Vec<StatusUpdate> = (launch_outputs(s).into_iter())
            .flat_map(|(executor, tasks)| {
                tasks.into_iter().map(move |l| StatusUpdate {
                    executor,
                    task: l.task,
                    attempt: l.attempt,
                    state: TaskState::Finished,
                    data: Bytes::new(),
                })
            })
            .collect();
        if updates.is_empty() {
            return;
        }
        s.handle_statuses(updates, now_us);
    }
}

#[test]
fn a_big_job_leaves_its_records_for_the_caller_to_free_and_a_small_one_none() {
    fn sendable<T: Send>() {}
    sendable::<Remains>();
    let mut s = with_executor(1024);
    s.handle_submit(same(100), 0).expect("accepted");
    finish_all(&mut s, 1);
    assert!(
        s.poll_remains().is_none(),
        "a small job's are freed in place"
    );
    s.handle_submit(same(spare::REMAINS_MIN_TASKS), 2)
        .expect("accepted");
    finish_all(&mut s, 3);
    assert_eq!(s.active_jobs(), 0);
    let remains = s.poll_remains().expect("a big job's");
    assert_eq!(remains.tasks(), spare::REMAINS_MIN_TASKS);
    assert!(s.poll_remains().is_none(), "once");
    // Nobody takes them: at most a few are kept.
    for at in 0..spare::REMAINS_KEPT as u64 + 2 {
        let job = s.handle_submit(same(spare::REMAINS_MIN_TASKS), 10 + at);
        assert!(s.handle_cancel(job.expect("accepted"), 10 + at));
    }
    let kept = std::iter::from_fn(|| s.poll_remains()).count();
    assert_eq!(kept, spare::REMAINS_KEPT);
}

#[test]
fn a_big_job_of_task_specs_leaves_them_for_the_caller_to_free_once_its_records_are_built() {
    let located = |n: usize| {
        let tasks: Vec<TaskSpec> = (0..n)
            .map(|i| TaskSpec {
                preferred_hosts: vec![format!("h{}", i % 7).into(), format!("h{}", i % 5).into()],
                ..TaskSpec::new("f", Bytes::new())
            })
            .collect();
        JobSpec::new(tasks)
    };
    let mut s = with_executor(1024);
    s.handle_submit(located(100), 0).expect("accepted");
    assert!(
        s.poll_remains().is_none(),
        "a small job's are freed in place"
    );
    s.handle_submit(located(spare::REMAINS_MIN_TASKS), 1)
        .expect("accepted");
    // Built a chunk per tick (`building.rs`): its specs are spent once the last is built.
    let chunks = spare::REMAINS_MIN_TASKS.div_ceil(types::BUILD_CHUNK_TASKS) as u64;
    for tick in 1..chunks {
        assert!(s.poll_remains().is_none(), "still built");
        s.handle_timeout(1 + tick);
    }
    let spent = s
        .poll_remains()
        .expect("the big job's specs, once its records are built");
    assert_eq!(spent.tasks(), spare::REMAINS_MIN_TASKS);
    assert!(s.poll_remains().is_none(), "once");
    drop(spent);
    // Its records hold what they need of them: every task runs once, to the end.
    finish_all(&mut s, 2);
    assert_eq!(s.active_jobs(), 0);
    let tasks = 100 + spare::REMAINS_MIN_TASKS as u64;
    assert_eq!((s.stats().launched, s.stats().succeeded), (tasks, tasks));
    let ended = s.poll_remains().expect("the big job's records, at its end");
    assert_eq!(ended.tasks(), spare::REMAINS_MIN_TASKS);
}

#[test]
fn a_small_jobs_successes_are_all_samples_and_a_big_ones_one_in_eight_past_its_first_tasks() {
    let mut s = Scheduler::new(Config {
        slow_start_slots: 1024,
        hedging: Some(HedgeConfig::default()),
        ..Config::default()
    });
    s.handle_register(executor(1, 1024), 0).expect("registered");
    s.handle_submit(same(40), 0).expect("accepted");
    finish_all(&mut s, 1);
    assert_eq!(
        s.hedge.samples("f"),
        Some(40),
        "every success of a small job"
    );
    s.handle_submit(same(1_000), 2).expect("accepted");
    finish_all(&mut s, 3);
    // Tasks 0..64, then about one in 8 of the other 936 (117).
    let big = s.hedge.samples("f").expect("a record") - 40;
    assert!((64 + 100..=64 + 135).contains(&big), "{big} samples");
}

/// The launches of the outputs emitted so far, as (executor, task index, attempt, payload,
/// cores, speculative).
fn launches(s: &mut Scheduler) -> Vec<(ExecutorId, u32, u32, Bytes, u32, bool)> {
    (launch_outputs(s).into_iter())
        .flat_map(|(executor, tasks)| {
            (tasks.into_iter()).map(move |l| {
                let index = l.task.index();
                (
                    executor,
                    index,
                    l.attempt,
                    l.payload,
                    l.cores,
                    l.speculative,
                )
            })
        })
        .collect()
}

#[test]
fn a_run_of_never_run_tasks_launches_in_one_go_as_one_at_a_time_would() {
    for cores in [1, 2, 3] {
        launches_in_one_go_as_one_at_a_time(cores);
    }
}

/// The same 40 tasks of `cores` cores each as one function over payloads (whose never-run
/// tasks an executor offered alone takes as one range) and as 40 task specs (which leave one
/// at a time), on an executor of 8 slots: everything the two schedulers tell is the same.
fn launches_in_one_go_as_one_at_a_time(cores: u32) {
    let payload = |i: u32| Bytes::from(vec![i as u8, 7]);
    let ranged = JobSpec::new(Tasks::Same {
        function: "f".into(),
        cores,
        payloads: (0..40).map(payload).collect(),
    });
    let single = JobSpec::new(
        (0..40)
            .map(|i| TaskSpec {
                cores,
                ..TaskSpec::new("f", payload(i))
            })
            .collect::<Vec<_>>(),
    );
    let mut pair = [ranged, single].map(|spec| {
        let mut s = Scheduler::new(Config {
            slow_start_slots: 8,
            hedging: Some(HedgeConfig::default()),
            // The failed task retries on the one executor.
            exclusion: None,
            ..Config::default()
        });
        s.handle_register(executor(1, 8), 0).expect("registered");
        let id = s.handle_submit(spec, 0).expect("accepted");
        (s, id)
    });
    let [(a, id), (b, _)] = &mut pair;
    assert_eq!(
        job_at(a, *id).tasks.len(),
        (8 / cores) as usize,
        "the first built as they left"
    );
    let mut now_us = 0;
    loop {
        now_us += 10;
        let (got, want) = (launches(a), launches(b));
        assert_eq!(got, want, "the same launches at {now_us}");
        assert_eq!(a.stats(), b.stats());
        assert_eq!(a.job_info(*id), b.job_info(*id));
        assert_eq!(
            runs_of(a),
            runs_of(b),
            "booked alike, hedging's thresholds too"
        );
        assert_eq!(a.hedge.next_check_us(), b.hedge.next_check_us());
        for index in 0..40 {
            let task = TaskId::new(*id, index);
            assert_eq!(a.task_info(task), b.task_info(task), "task {index}");
        }
        if got.is_empty() {
            break;
        }
        // Half of what launched succeeds, one fails (retried), one is killed for good; the
        // rest runs on.
        for (i, (executor, index, attempt, _, _, _)) in got.into_iter().enumerate() {
            let task = TaskId::new(*id, index);
            for s in [&mut *a, &mut *b] {
                match i % 4 {
                    0 | 1 => s.handle_status(
                        StatusUpdate {
                            executor,
                            task,
                            attempt,
                            state: if index == 9 {
                                TaskState::Failed
                            } else {
                                TaskState::Finished
                            },
                            data: Bytes::new(),
                        },
                        now_us,
                    ),
                    2 if index == 22 => {
                        s.handle_kill(task, "test", now_us);
                    }
                    _ => {}
                }
            }
        }
        // Then the runs left report, so the next round starts from an idle executor.
        finish_all_pair(a, b, now_us + 5);
    }
    assert_eq!((a.active_jobs(), b.active_jobs()), (0, 0), "{cores} cores");
    assert_eq!(a.stats(), b.stats());
}

/// Reports every attempt both schedulers' executor 1 runs as finished, at `now_us`.
fn finish_all_pair(a: &mut Scheduler, b: &mut Scheduler, now_us: u64) {
    for s in [a, b] {
        let updates = running_on_1(s).into_iter().map(finished_on_1);
        s.handle_statuses(updates.collect::<Vec<_>>(), now_us);
    }
}

/// Executor 1's runs, as (attempt, cores, started, hedging's record and threshold), sorted.
fn runs_of(s: &Scheduler) -> Vec<(Attempt, u32, u64, u32, u64)> {
    let runs = runs_on_1(s);
    let mut all: Vec<_> = (runs.iter())
        .map(|(key, r)| (*key, r.cores, r.started_us, r.record, r.threshold_us))
        .collect();
    all.sort();
    all
}

#[test]
fn cancelling_a_job_with_more_records_than_runs_kills_exactly_its_running_attempts() {
    let mut s = with_executor(64);
    let id = s.handle_submit(same(10_000), 0).expect("accepted");
    // Rounds of successes build records far past the executor's 64 runs.
    for round in 0..40u64 {
        launch_outputs(&mut s);
        let done = running_on_1(&s).into_iter().take(50).map(finished_on_1);
        s.handle_statuses(done.collect::<Vec<_>>(), round + 1);
    }
    launch_outputs(&mut s);
    let running = running_on_1(&s);
    assert_eq!(running.len(), 64);
    assert!(job_at(&s, id).tasks.len() > 2_000, "more records than runs");
    assert!(s.handle_cancel(id, 100));
    let mut outs = Vec::new();
    s.drain_outputs(&mut outs);
    let killed: Vec<Attempt> = (outs.iter())
        .filter_map(|o| match o {
            Output::Kill { task, attempt, .. } => Some(Attempt::new(*task, *attempt)),
            _ => None,
        })
        .collect();
    assert_eq!(
        killed, running,
        "each running attempt killed once, in task order"
    );
    assert!(outs.iter().any(|o| matches!(
        o,
        Output::Event(Event::JobOutcome { job, outcome: JobOutcome::Cancelled }) if *job == id
    )));
    assert_eq!(
        (s.unfinished_tasks(), s.pending_tasks(), s.active_jobs()),
        (0, 0, 0)
    );
    let placed = runs_on_1(&s).entries().filter(|&(_, _, orphan)| !orphan);
    assert_eq!(placed.count(), 0, "every run left is an orphan");
}

#[test]
fn freed_slots_take_waiting_jobs_in_fifo_order_priority_first() {
    let mut s = with_executor(2);
    let mut jobs = Vec::new();
    for at in 0..4 {
        jobs.push(s.handle_submit(spec(1), at).expect("accepted"));
    }
    let urgent = s
        .handle_submit(
            JobSpec {
                priority: 10,
                ..spec(1)
            },
            4,
        )
        .expect("accepted");
    assert_eq!(launched_jobs(&mut s), [jobs[0], jobs[1]], "two slots");
    // Both slots free in one report: the urgent job (listed out of order), then the oldest.
    let done = running_on_1(&s).into_iter().map(finished_on_1);
    s.handle_statuses(done.collect::<Vec<_>>(), 10);
    assert_eq!(launched_jobs(&mut s), [urgent, jobs[2]]);
}

/// The jobs of the tasks launched by the outputs emitted so far, in launch order.
fn launched_jobs(s: &mut Scheduler) -> Vec<JobId> {
    (launch_outputs(s).iter())
        .flat_map(|(_, tasks)| tasks.iter().map(|l| l.task.job()))
        .collect()
}

#[test]
fn a_frames_successes_applied_as_runs_leave_what_one_report_at_a_time_would() {
    for sharing in [Sharing::Fifo, Sharing::Fair] {
        successes_as_runs_as_one_at_a_time(sharing);
    }
}

/// Two schedulers alike, two executors of 8 slots, hedging and speculation on, jobs of each
/// form (one keeping results past its limit): each round's reports (successes of runs of
/// jobs on both executors, failures, kills, stragglers left running, a duplicate, a RUNNING,
/// an unknown executor's) go to one as a batch and to the other one report at a time
/// (`apply_update`, then the offers once, as the batch path did before runs): everything the
/// two tell is the same.
fn successes_as_runs_as_one_at_a_time(sharing: Sharing) {
    let config = Config {
        sharing,
        pools: vec![PoolConfig {
            name: "p".into(),
            mode: sharing,
            weight: 2,
            min_share: 1,
        }],
        // Windows that widen with successes.
        slow_start_slots: 1,
        hedging: Some(HedgeConfig::default()),
        speculation: Some(SpeculationConfig::default()),
        // Failed tasks retry on the two executors.
        exclusion: None,
        ..Config::default()
    };
    let [mut a, mut b] = [(); 2].map(|_| {
        let mut s = Scheduler::new(config.clone());
        for id in [1, 2] {
            s.handle_register(executor(id, 8), 0).expect("registered");
        }
        s
    });
    let mut jobs = Vec::new();
    for round in 0..120u64 {
        let now_us = round * 40_000;
        if round < 24 && round % 3 == 0 {
            let spec = match round % 9 {
                0 => same(16),
                3 => JobSpec {
                    pool: "p".into(),
                    ..spec(12)
                },
                _ => JobSpec {
                    keep_results: true,
                    result_bytes_max: Some(10),
                    ..spec(8)
                },
            };
            let id = a.handle_submit(spec.clone(), now_us).expect("accepted");
            assert_eq!(b.handle_submit(spec, now_us), Ok(id));
            jobs.push(id);
        }
        let updates = reports(&a, round);
        a.handle_statuses(updates.clone(), now_us + 1);
        one_report_at_a_time(&mut b, updates, now_us + 1);
        a.handle_timeout(now_us + 2);
        b.handle_timeout(now_us + 2);
        let (mut got, mut want) = (Vec::new(), Vec::new());
        a.drain_outputs(&mut got);
        b.drain_outputs(&mut want);
        assert_eq!(got, want, "{sharing:?}: the same outputs in round {round}");
        assert_eq!(a.stats(), b.stats(), "{sharing:?}, round {round}");
        for id in [1, 2].map(ExecutorId) {
            assert_eq!(a.executor_cores(id), b.executor_cores(id));
            assert_eq!(a.executor_usable(id), b.executor_usable(id));
            assert_eq!(runs_of_on(&a, id), runs_of_on(&b, id));
        }
        assert_eq!(a.hedge.next_check_us(), b.hedge.next_check_us());
        assert_eq!(a.poll_timeout(), b.poll_timeout());
        for &id in &jobs {
            assert_eq!(a.job_info(id), b.job_info(id), "{sharing:?}, round {round}");
            for index in 0..16 {
                let task = TaskId::new(id, index);
                assert_eq!(a.task_info(task), b.task_info(task));
            }
        }
    }
    assert_eq!((a.active_jobs(), b.active_jobs()), (0, 0), "{sharing:?}");
    let stats = a.stats();
    assert!(
        stats.succeeded > 50 && stats.attempts_failed > 5,
        "{stats:?}"
    );
    assert!(stats.speculative_launched >= 2, "{stats:?}");
    assert!(stats.ignored_updates >= 30, "{stats:?}");
}

/// The old batch path: each report applied alone, then the offers once.
fn one_report_at_a_time(s: &mut Scheduler, updates: Vec<StatusUpdate>, now_us: u64) {
    let mut ended = false;
    for mut update in updates {
        ended |= s.apply_update(now_us, &mut update);
    }
    if ended {
        s.offer(now_us);
        s.flush();
    }
}

/// A round's reports of what `s`'s executors run: executor 1's attempts, then 2's, each in
/// task order, mostly successes (three bytes of result), with failures and kills, and each
/// job's task 2 left running for its first 60 rounds; a duplicate, a RUNNING and an unknown
/// executor's report among them.
fn reports(s: &Scheduler, round: u64) -> Vec<StatusUpdate> {
    let mut updates = Vec::new();
    for id in [1, 2].map(ExecutorId) {
        let slot = s.book.slot_of(id).expect("registered");
        let mut running: Vec<Attempt> = (s.book.get(slot).expect("an executor").running.iter())
            .map(|(key, _)| *key)
            .collect();
        running.sort();
        for (k, key) in running.into_iter().enumerate() {
            // Task 2's first attempts straggle for a while (they are copied).
            if key.task.index() == 2 && key.attempt == 0 && round < 60 {
                continue;
            }
            let state = match (k as u64 + round) % 11 {
                3 => TaskState::Failed,
                7 => TaskState::Killed,
                _ => TaskState::Finished,
            };
            let update = StatusUpdate {
                executor: id,
                task: key.task,
                attempt: key.attempt,
                state,
                data: Bytes::from(vec![k as u8; 3]),
            };
            if k == 1 {
                updates.push(StatusUpdate {
                    state: TaskState::Running,
                    ..update.clone()
                });
                updates.push(StatusUpdate {
                    executor: ExecutorId(99),
                    ..update.clone()
                });
            }
            updates.push(update);
        }
    }
    if let Some(first) = updates.iter().find(|u| u.state == TaskState::Finished) {
        updates.insert(updates.len() / 2, first.clone());
    }
    updates
}

/// Executor `id`'s runs, as (attempt, cores, started, hedging's record and threshold),
/// sorted.
fn runs_of_on(s: &Scheduler, id: ExecutorId) -> Vec<(Attempt, u32, u64, u32, u64)> {
    let slot = s.book.slot_of(id).expect("registered");
    let runs = &s.book.get(slot).expect("an executor").running;
    let mut all: Vec<_> = (runs.iter())
        .map(|(key, r)| (*key, r.cores, r.started_us, r.record, r.threshold_us))
        .collect();
    all.sort();
    all
}

/// A one-task job of `cores` cores preferring `hosts` and `executors`.
fn located(cores: u32, hosts: &[&str], executors: &[u64]) -> JobSpec {
    JobSpec::new(vec![TaskSpec {
        cores,
        preferred_hosts: hosts.iter().map(|&h| h.into()).collect(),
        preferred_executors: executors.iter().map(|&e| ExecutorId(e)).collect(),
        ..TaskSpec::new("f", Bytes::new())
    }])
}

/// The host indices job `id`'s preference queues are keyed by, in order.
fn queued_hosts(s: &Scheduler, id: JobId) -> Vec<u32> {
    let job = job_at(s, id);
    let mut hosts: Vec<u32> = (job.classes.iter())
        .filter_map(|q| q.prefs.as_ref())
        .flat_map(|q| q.by_host.keys().copied())
        .collect();
    hosts.sort_unstable();
    hosts
}

/// Submits `jobs` one-task jobs, each preferring a host no other names, from `from` on,
/// and runs each to its end.
fn churn_host_names(s: &mut Scheduler, from: usize, jobs: usize) {
    for i in from..from + jobs {
        let name = format!("p{i}");
        (s.handle_submit(located(1, &[&name], &[]), i as u64)).expect("accepted");
        finish_all(s, i as u64);
    }
}

#[test]
fn host_names_nothing_holds_any_more_give_their_records_to_new_names() {
    let mut s = with_executor(4);
    let jobs = 20 * book::HOSTS_SWEEP_MIN;
    churn_host_names(&mut s, 0, jobs);
    assert_eq!(
        s.active_jobs(),
        0,
        "every job ran (its host has no executor)"
    );
    assert!(
        s.book.hosts.len() <= 2 * book::HOSTS_SWEEP_MIN,
        "{} host records after {jobs} names",
        s.book.hosts.len()
    );
    assert_eq!(
        s.book.host_index("h"),
        0,
        "the executor's host kept its record"
    );
    assert!(s.book.host_live(0));
}

#[test]
fn a_host_index_a_waiting_job_holds_outlives_sweeps_and_the_executor_it_came_from() {
    let mut s = with_executor(1);
    let e = ExecutorInfo {
        host: "e".into(),
        ..executor(2, 1)
    };
    s.handle_register(e, 0).expect("registered");
    // Two cores: it waits, queued under host "x" (named) and host "e" (executor 2's).
    let waiting = s
        .handle_submit(located(2, &["x"], &[2]), 0)
        .expect("accepted");
    let held = queued_hosts(&s, waiting);
    assert_eq!(held.len(), 2);
    assert!(s.handle_remove(ExecutorId(2), RemovalReason::Killed, 1));
    let jobs = 4 * book::HOSTS_SWEEP_MIN;
    churn_host_names(&mut s, 1, jobs);
    assert!(
        s.book.hosts.len() < jobs / 2,
        "records were freed: {} for {jobs} names",
        s.book.hosts.len()
    );
    assert_eq!(queued_hosts(&s, waiting), held);
    let mut now = vec![s.book.host_index("x"), s.book.host_index("e")];
    now.sort_unstable();
    assert_eq!(now, held, "the indices it holds are still its hosts'");
    // An executor on its host is found by the host's index, and takes its task.
    let x = ExecutorInfo {
        host: "x".into(),
        ..executor(3, 2)
    };
    s.handle_register(x, 10).expect("registered");
    let outs = launch_outputs(&mut s);
    assert_eq!(outs.len(), 1);
    assert_eq!(outs[0].0, ExecutorId(3));
}

#[test]
fn a_host_excluded_with_no_executor_left_on_it_stays_excluded_through_sweeps() {
    let mut s = Scheduler::new(Config {
        exclusion: Some(ExclusionConfig {
            executor_failures_max: 1,
            host_excluded_executors_max: 1,
            ..ExclusionConfig::default()
        }),
        ..Config::default()
    });
    s.handle_register(executor(1, 4), 0).expect("registered");
    let bad = |id| ExecutorInfo {
        host: "bad".into(),
        ..executor(id, 1)
    };
    s.handle_register(bad(2), 0).expect("registered");
    s.handle_submit(located(1, &[], &[2]), 0).expect("accepted");
    let outs = launch_outputs(&mut s);
    let (executor, tasks) = outs.first().expect("a launch");
    assert_eq!(*executor, ExecutorId(2));
    let failed = StatusUpdate {
        executor: ExecutorId(2),
        task: tasks[0].task,
        attempt: tasks[0].attempt,
        state: TaskState::Failed,
        data: Bytes::from_static(b"boom"),
    };
    s.handle_status(failed, 1);
    assert!(s.handle_remove(ExecutorId(2), RemovalReason::Killed, 2));
    finish_all(&mut s, 3);
    churn_host_names(&mut s, 1, 4 * book::HOSTS_SWEEP_MIN);
    assert!(
        s.book.hosts.len() < 2 * book::HOSTS_SWEEP_MIN,
        "records were freed"
    );
    let refused = s.handle_register(bad(3), 4);
    assert!(
        matches!(refused, Err(Refusal::HostExcluded { .. })),
        "{refused:?}"
    );
}

/// A job of `n` task specs, one in three preferring host "x"; task `i`'s payload is `i`.
fn specs_job(n: usize) -> JobSpec {
    let tasks: Vec<TaskSpec> = (0..n)
        .map(|i| TaskSpec {
            preferred_hosts: match i % 3 {
                0 => vec!["x".into()],
                _ => Vec::new(),
            },
            ..TaskSpec::new("f", Bytes::from((i as u32).to_le_bytes().to_vec()))
        })
        .collect();
    JobSpec::new(tasks)
}

/// Runs every launch to success (its result its payload) until none is left: the outcomes
/// seen on the way.
fn run_all(s: &mut Scheduler, now_us: u64) -> Vec<(JobId, JobOutcome)> {
    let mut outs = Vec::new();
    finish_launches(s, now_us, &mut outs);
    (outs.into_iter())
        .flat_map(split)
        .filter_map(|out| match out {
            Output::Event(Event::JobOutcome { job, outcome }) => Some((job, outcome)),
            _ => None,
        })
        .collect()
}

/// Answers every launch with a success (its payload as the result) until none is left,
/// appending to `outs` every output drained on the way.
fn finish_launches(s: &mut Scheduler, now_us: u64, outs: &mut Vec<Output>) {
    loop {
        let from = outs.len();
        s.drain_outputs(outs);
        let mut updates = Vec::new();
        for out in &outs[from..] {
            if let Output::Launch { executor, tasks } = out {
                updates.extend(tasks.iter().map(|l| StatusUpdate {
                    executor: *executor,
                    task: l.task,
                    attempt: l.attempt,
                    state: TaskState::Finished,
                    data: l.payload.clone(),
                }));
            }
        }
        if updates.is_empty() {
            return;
        }
        s.handle_statuses(updates, now_us);
    }
}

/// Ticks once a micro from `from_us` (building jobs a chunk a tick), finishing every launch,
/// until no job is active; every output drained.
fn run_ticking(s: &mut Scheduler, from_us: u64) -> Vec<Output> {
    let mut outs = Vec::new();
    let mut now_us = from_us;
    while s.active_jobs() > 0 {
        assert!(now_us < from_us + 100, "the jobs end");
        s.handle_timeout(now_us);
        finish_launches(s, now_us, &mut outs);
        now_us += 1;
    }
    outs
}

/// A scheduler building jobs of task specs four tasks a tick, with executor 1 of 4 slots.
fn chunked_scheduler() -> Scheduler {
    let mut s = Scheduler::new(Config {
        build_chunk_tasks: 4,
        slow_start_slots: 4,
        ..Config::default()
    });
    s.handle_register(executor(1, 4), 0).expect("registered");
    s
}

#[test]
fn a_big_job_of_task_specs_is_built_a_chunk_per_tick_and_runs_whole_once_published() {
    let mut s = with_executor(64);
    let n = 3 * types::BUILD_CHUNK_TASKS + 5;
    let big = s.handle_submit(specs_job(n), 0).expect("accepted");
    // Its first chunk is built, nothing of it is seen but its counts.
    assert!(s.is_active(big) && s.job_info(big).is_none());
    assert_eq!(
        (s.active_jobs(), s.pending_tasks(), s.unfinished_tasks()),
        (1, n, n)
    );
    assert_eq!(s.poll_timeout(), Some(0), "its next chunk is due at once");
    assert_eq!(launched(&mut s), 0);
    // A small job submitted after it runs meanwhile.
    let small = s.handle_submit(spec(1), 1).expect("accepted");
    let outcomes = run_all(&mut s, 2);
    assert!(matches!(&outcomes[..], [(id, JobOutcome::Succeeded(_))] if *id == small));
    // A chunk per tick: published with its last.
    for tick in 1..3 {
        s.handle_timeout(10 + tick);
        assert!(s.job_info(big).is_none(), "tick {tick}: still built");
        assert_eq!(launched(&mut s), 0);
    }
    s.handle_timeout(20);
    let info = s.job_info(big).expect("published");
    assert_eq!((info.tasks, info.pending + info.running), (n, n));
    assert_eq!(info.running, 64, "offered as it was published");
    assert_ne!(s.poll_timeout(), Some(0));
    let outcomes = run_all(&mut s, 30);
    let [(id, JobOutcome::Succeeded(results))] = &outcomes[..] else {
        panic!("one outcome: {outcomes:?}");
    };
    assert_eq!(*id, big);
    assert_eq!(results.len(), n);
    for (i, result) in results.iter().enumerate() {
        assert_eq!(
            result[..],
            (i as u32).to_le_bytes(),
            "task {i}'s own result"
        );
    }
    assert_eq!(
        (s.active_jobs(), s.pending_tasks(), s.unfinished_tasks()),
        (0, 0, 0)
    );
}

#[test]
fn a_job_being_built_ends_as_it_is_when_cancelled_and_has_a_killed_task_killed_once_published() {
    let mut s = chunked_scheduler();
    // Twelve tasks, a chunk of four: the first chunk prefers host "a", the rest host "b".
    let job = |s: &mut Scheduler, now_us| {
        let tasks: Vec<TaskSpec> = (0..12)
            .map(|i| TaskSpec {
                preferred_hosts: vec![if i < 4 { "a" } else { "b" }.into()],
                ..TaskSpec::new("f", Bytes::new())
            })
            .collect();
        s.handle_submit(JobSpec::new(tasks), now_us)
            .expect("accepted")
    };
    let hosts = |s: &Scheduler| s.book.hosts_in_use();
    let cancelled = job(&mut s, 1);
    assert_eq!(hosts(&s), 2, "the executor's host and the first chunk's");
    assert!(
        s.handle_cancel(cancelled, 2),
        "a job being built is cancelled"
    );
    assert_eq!(
        hosts(&s),
        2,
        "the rest was never built: host \"b\" never looked up"
    );
    let outcomes = run_all(&mut s, 3);
    assert!(matches!(&outcomes[..], [(id, JobOutcome::Cancelled)] if *id == cancelled));
    assert_eq!(
        (s.active_jobs(), s.pending_tasks(), s.unfinished_tasks()),
        (0, 0, 0)
    );
    assert_eq!(s.stats().launched, 0);
    assert_eq!(s.poll_timeout(), None);
    // Failed (its deadline, say): the same.
    let failed = job(&mut s, 4);
    assert!(s.handle_fail(failed, "deadline", 5));
    let outcomes = run_all(&mut s, 6);
    assert!(
        matches!(&outcomes[..], [(id, JobOutcome::Failed(r))] if *id == failed && r[0] == "deadline")
    );
    assert_eq!((s.active_jobs(), s.unfinished_tasks()), (0, 0));
    // Killing one of its tasks holds nothing up: it is killed once the job is published (its
    // other tasks run), and the job fails.
    let killed = job(&mut s, 7);
    let task = TaskId::new(killed, 11);
    assert!(s.handle_kill(task, "no", 8));
    assert!(!s.handle_kill(task, "again", 8), "killed already");
    assert!(
        !s.handle_kill(TaskId::new(killed, 12), "no", 8),
        "no such task"
    );
    assert_eq!(
        hosts(&s),
        2,
        "not built by the kill: host \"b\" not looked up yet"
    );
    let outs = run_ticking(&mut s, 9);
    let launched = |o: &Output| match o {
        Output::Launch { tasks, .. } => tasks.iter().any(|l| l.task == task),
        _ => false,
    };
    assert!(!outs.iter().any(launched), "the killed task ran");
    let outs: Vec<Output> = outs.into_iter().flat_map(split).collect();
    let results: Vec<(u32, bool)> = (outs.iter())
        .filter_map(|o| match o {
            Output::Event(Event::TaskResult { task, result }) => {
                Some((task.index(), result.is_ok()))
            }
            _ => None,
        })
        .collect();
    let ended: Vec<(JobId, JobOutcome)> = (outs.into_iter())
        .filter_map(|o| match o {
            Output::Event(Event::JobOutcome { job, outcome }) => Some((job, outcome)),
            _ => None,
        })
        .collect();
    let mut succeeded: Vec<u32> = (results.iter()).filter(|r| r.1).map(|r| r.0).collect();
    succeeded.sort_unstable();
    assert_eq!(
        succeeded,
        (0..11).collect::<Vec<_>>(),
        "its other tasks ran"
    );
    assert_eq!(
        (results.iter()).filter(|r| !r.1).collect::<Vec<_>>(),
        [&(11, false)],
        "the killed one failed, once"
    );
    assert!(
        matches!(&ended[..], [(id, JobOutcome::Failed(r))] if *id == killed && r.iter().any(|r| r.contains("killed: no")))
    );
    assert_eq!((s.active_jobs(), s.unfinished_tasks()), (0, 0));
}

#[test]
fn a_job_built_while_executors_come_and_go_counts_its_localities_as_of_its_publishing() {
    let mut s = with_executor(1);
    let big = s
        .handle_submit(specs_job(2 * types::BUILD_CHUNK_TASKS), 0)
        .expect("accepted");
    // An executor on host "x", which a third of its tasks prefer, registers meanwhile.
    let x = ExecutorInfo {
        host: "x".into(),
        ..executor(2, 1)
    };
    s.handle_register(x, 1).expect("registered");
    s.handle_timeout(2);
    let info = s.job_info(big).expect("published");
    assert_eq!(info.locality_level, LocalityLevel::Host);
    // It leaves: the level has nothing left to wait for.
    assert!(s.handle_remove(ExecutorId(2), RemovalReason::Killed, 3));
    s.handle_timeout(4);
    let info = s.job_info(big).expect("active");
    assert_eq!(info.locality_level, LocalityLevel::Any);
}

#[test]
fn a_task_past_a_big_jobs_first_chunk_that_cannot_run_fails_the_job_once_built() {
    let mut s = Scheduler::new(Config {
        payload_max_bytes: 8,
        slow_start_slots: 4,
        ..Config::default()
    });
    s.handle_register(executor(1, 4), 0).expect("registered");
    let with = |zero: usize, big: usize| {
        let mut spec = specs_job(2 * types::BUILD_CHUNK_TASKS);
        let Tasks::Each(tasks) = &mut spec.tasks else {
            unreachable!("a job of specs");
        };
        tasks[zero].cores = 0;
        tasks[big].payload = Bytes::from(vec![0; 9]);
        spec
    };
    let spec = with(types::BUILD_CHUNK_TASKS + 9, types::BUILD_CHUNK_TASKS + 7);
    let job = s
        .handle_submit(spec, 0)
        .expect("accepted: its first chunk is fine");
    s.handle_timeout(1);
    let outcomes = run_all(&mut s, 2);
    let [(id, JobOutcome::Failed(reasons))] = &outcomes[..] else {
        panic!("one failure: {outcomes:?}");
    };
    assert_eq!(*id, job);
    let first = oversized_reason(types::BUILD_CHUNK_TASKS + 7, 9, 8);
    assert_eq!(
        reasons.first(),
        Some(&first),
        "the first task that cannot run"
    );
    assert_eq!(s.stats().launched, 0, "none of its tasks ran");
    assert_eq!((s.active_jobs(), s.unfinished_tasks()), (0, 0));
    // In the first chunk: refused at submission, as any job's.
    let refused = s.handle_submit(with(3, types::BUILD_CHUNK_TASKS + 7), 3);
    assert!(
        matches!(refused, Err(SubmitError::ZeroCores(3))),
        "{refused:?}"
    );
}

/// A big job's tasks name their hosts by shared names (clones of one `Arc<str>` per host),
/// by names of their own, and by more shared names than `HostsSeen` has slots (so names
/// clash there): each task's preferences hold the index of each name it gave, in order.
#[test]
fn a_big_jobs_host_names_shared_own_or_clashing_give_each_task_its_own_hosts() {
    let mut s = with_executor(4);
    let shared: Vec<Arc<str>> = (0..3 * HostsSeen::SLOTS)
        .map(|h| format!("host{h}").into())
        .collect();
    let n = 2 * shared.len();
    let names_of = |i: usize| -> [Arc<str>; 2] {
        let own: Arc<str> = format!("host{}", (i * 7) % shared.len()).into();
        [shared[i % shared.len()].clone(), own]
    };
    let specs: Vec<TaskSpec> = (0..n)
        .map(|i| TaskSpec {
            preferred_hosts: names_of(i).to_vec(),
            ..TaskSpec::new("f", Bytes::new())
        })
        .collect();
    let id = s.handle_submit(JobSpec::new(specs), 0).expect("accepted");
    let job = job_at(&s, id);
    for i in 0..n {
        let prefs = job.prefs[i].as_ref().expect("preferences");
        let named: Vec<&str> = (prefs.hosts.iter())
            .map(|&h| {
                s.book
                    .host(h)
                    .and_then(book::Host::name)
                    .expect("a named host")
            })
            .collect();
        let want = names_of(i);
        assert_eq!(named, [&*want[0], &*want[1]], "task {i}");
    }
}

/// Every task of a job being built killed meanwhile: it ends when published, failed, with a
/// failed result for each task and nothing launched.
#[test]
fn a_job_being_built_with_every_task_killed_fails_when_published_and_launches_nothing() {
    let mut s = chunked_scheduler();
    let tasks: Vec<TaskSpec> = (0..12)
        .map(|_| TaskSpec {
            preferred_hosts: vec!["a".into()],
            ..TaskSpec::new("f", Bytes::new())
        })
        .collect();
    let job = s.handle_submit(JobSpec::new(tasks), 1).expect("accepted");
    for i in 0..12 {
        assert!(s.handle_kill(TaskId::new(job, i), "no", 2), "task {i}");
    }
    let outs = run_ticking(&mut s, 3);
    assert!(!outs.iter().any(|o| matches!(o, Output::Launch { .. })));
    let failed = (outs.iter())
        .filter(|o| matches!(o, Output::Event(Event::TaskResult { result: Err(_), .. })))
        .count();
    assert_eq!(failed, 12);
    assert!(outs.iter().any(|o| matches!(
        o,
        Output::Event(Event::JobOutcome { job: j, outcome: JobOutcome::Failed(_) }) if *j == job
    )));
    assert_eq!(
        (s.active_jobs(), s.pending_tasks(), s.unfinished_tasks()),
        (0, 0, 0)
    );
    assert_eq!(s.poll_timeout(), None);
}

/// A job of `n` task specs whose task `i` prefers, by `i % 6`: executor 1, executor 2,
/// host h1, host h2, a host no executor is on, nothing; or, `to_1_or_h2`, executor 1 (even
/// `i`) and host h2 (odd): executor 2 gets none of them until the executor level ends, as
/// executor 1 takes its last.
fn mixed_locality(n: u32, to_1_or_h2: bool) -> JobSpec {
    let tasks = (0..n).map(|i| {
        let (executors, hosts): (Vec<u64>, Vec<&str>) = match (to_1_or_h2, i % 6) {
            (true, _) if i % 2 == 0 => (vec![1], vec![]),
            (true, _) => (vec![], vec!["h2"]),
            (false, 0) => (vec![1], vec![]),
            (false, 1) => (vec![2], vec![]),
            (false, 2) => (vec![], vec!["h1"]),
            (false, 3) => (vec![], vec!["h2"]),
            (false, 4) => (vec![], vec!["h9"]),
            _ => (vec![], vec![]),
        };
        TaskSpec {
            preferred_hosts: hosts.into_iter().map(Into::into).collect(),
            preferred_executors: executors.into_iter().map(ExecutorId).collect(),
            ..TaskSpec::new("f", Bytes::from(vec![i as u8]))
        }
    });
    JobSpec::new(tasks.collect::<Vec<_>>())
}

/// The executors' runs, reported finished at `now_us`: executor 1's alone when `only_1`.
fn finish_runs(s: &mut Scheduler, now_us: u64, only_1: bool) {
    let ids: &[u64] = if only_1 { &[1] } else { &[1, 2] };
    let mut updates = Vec::new();
    for &id in ids {
        for (key, ..) in runs_of_on(s, ExecutorId(id)) {
            updates.push(StatusUpdate {
                executor: ExecutorId(id),
                ..finished_on_1(key)
            });
        }
    }
    s.handle_statuses(updates, now_us);
}

#[test]
fn a_new_job_given_out_without_a_walk_stays_within_the_executors_window() {
    // An idle executor claiming a thousand cores, offered alone, takes from a new job of one
    // function over payloads (its tasks started without records) what its slow-start window
    // allows, not its free cores, in either mode.
    for walk_only in [false, true] {
        let mut s = Scheduler::new(Config {
            slow_start_slots: 4,
            ..Config::default()
        });
        s.walk_only = walk_only;
        s.handle_register(executor(1, 1_000), 0)
            .expect("registered");
        s.handle_submit(same(100), 0).expect("accepted");
        let got = launches(&mut s);
        assert_eq!(got.len(), 4, "walk only: {walk_only}");
        let indices: Vec<u32> = got.iter().map(|l| l.1).collect();
        assert_eq!(indices, [0, 1, 2, 3], "in task order");
        assert_eq!(s.executor_usable(ExecutorId(1)), Some(0));
    }
}

#[test]
fn assignments_without_a_walk_give_what_a_walk_per_task_gives_to_jobs_with_locality() {
    // Two executors on two hosts, waits short enough to widen within the run; jobs whose
    // tasks prefer each executor and host, a host with no executor, and nothing, beside a
    // job of one function over payloads. Rounds finish one executor's runs (the other
    // offered alone: `fill`, taking from the front) or both (several offered: a streak).
    let mut pair = [false, true].map(|walk_only| {
        let mut s = Scheduler::new(Config {
            slow_start_slots: 8,
            locality_wait_executor_us: 2_900,
            locality_wait_host_us: 1_900,
            ..Config::default()
        });
        s.walk_only = walk_only;
        for (id, host, cores) in [(1, "h1", 4), (2, "h2", 3)] {
            let info = ExecutorInfo {
                host: host.into(),
                ..executor(id, cores)
            };
            s.handle_register(info, 0).expect("registered");
        }
        s
    });
    let [a, b] = &mut pair;
    let mut jobs = Vec::new();
    let mut now_us = 0;
    let mut launched = 0;
    for round in 0..200u64 {
        now_us += 700;
        if round % 10 == 0 && round < 90 {
            for s in [&mut *a, &mut *b] {
                let job = match round % 30 {
                    0 => mixed_locality(14, true),
                    10 => mixed_locality(30, false),
                    _ => same(12),
                };
                jobs.push(s.handle_submit(job, now_us).expect("accepted"));
            }
        }
        for s in [&mut *a, &mut *b] {
            s.handle_timeout(now_us);
        }
        let (got, want) = (launches(a), launches(b));
        assert_eq!(got, want, "the same launches in round {round}");
        launched += got.len();
        assert_eq!(a.stats(), b.stats(), "round {round}");
        for &id in &jobs {
            assert_eq!(a.job_info(id), b.job_info(id), "round {round}");
        }
        for s in [&mut *a, &mut *b] {
            finish_runs(s, now_us + round * 137 % 700, round % 3 != 0);
        }
    }
    assert_eq!((a.active_jobs(), b.active_jobs()), (0, 0), "all ran");
    assert_eq!(launched as u64, a.stats().launched);
    assert!(
        launched >= 3 * (14 + 30 + 12),
        "every task launched: {launched}"
    );
}

#[test]
fn a_level_that_widens_while_filling_offers_the_executors_set_aside_as_a_walk_would() {
    // Executor 1 (h1, 6 cores, all busy) and executor 2 (h2, 1 core, set aside: it has no
    // task at the located job's executor level). Executor 1 frees its slots: a plain job of
    // priority that executor 2 cannot fit goes first, then the located job gives executor 1
    // its three tasks for it, the last of them emptying the executor level, which widens to
    // the host level while executor 1 still has a slot: executor 2 is offered again in the
    // same round and takes a task preferring h2, as it does when every task is walked for.
    let mut pair = [false, true].map(|walk_only| {
        let mut s = Scheduler::new(Config {
            slow_start_slots: 8,
            ..Config::default()
        });
        s.walk_only = walk_only;
        let on = |id, host: &str, cores| ExecutorInfo {
            host: host.into(),
            ..executor(id, cores)
        };
        s.handle_register(on(1, "h1", 6), 0).expect("registered");
        s.handle_submit(same(6), 0).expect("accepted");
        s.handle_register(on(2, "h2", 1), 0).expect("registered");
        s
    });
    let [a, b] = &mut pair;
    for s in [&mut *a, &mut *b] {
        s.handle_submit(mixed_locality(6, true), 10)
            .expect("accepted");
        let big = JobSpec {
            priority: 1,
            ..JobSpec::new(Tasks::Same {
                function: "f".into(),
                cores: 2,
                payloads: vec![Bytes::new()].into(),
            })
        };
        s.handle_submit(big, 11).expect("accepted");
    }
    let (got, want) = (launches(a), launches(b));
    assert_eq!(got, want);
    assert_eq!(got.len(), 6, "the first job fills executor 1: {got:?}");
    for s in [&mut *a, &mut *b] {
        finish_runs(s, 20, true);
    }
    let (got, want) = (launches(a), launches(b));
    assert_eq!(got, want, "the same launches");
    let on = |e: u64| got.iter().filter(|l| l.0 == ExecutorId(e)).count();
    assert_eq!((on(1), on(2)), (4, 1), "executor 2 had its turn: {got:?}");
    assert_eq!(a.stats(), b.stats());
}

#[test]
fn a_one_task_job_launched_alone_goes_where_the_offer_would_send_it() {
    // One-task jobs submitted one at a time over three executors (one of them of one core,
    // so it fills and leaves the round), finished a few at a time, sometimes while others
    // wait in line: a job submitted while nothing else waits launches without an offer
    // (`launch_alone`), and goes to the executor the offer's round-robin would have chosen.
    let mut pair = walk_pair(&[(1, 1), (2, 4), (3, 2)]);
    let [a, b] = &mut pair;
    let mut launched = 0;
    for round in 0..300u64 {
        let now_us = round * 100;
        for s in [&mut *a, &mut *b] {
            for _ in 0..(round % 4) {
                s.handle_submit(same(1), now_us).expect("accepted");
            }
        }
        let (got, want) = (launches(a), launches(b));
        assert_eq!(got, want, "the same launches in round {round}");
        launched += got.len();
        assert_eq!(a.stats(), b.stats(), "round {round}");
        for id in 1..=3 {
            let id = ExecutorId(id);
            assert_eq!(
                a.executor_usable(id),
                b.executor_usable(id),
                "round {round}"
            );
        }
        if round % 3 != 1 {
            for s in [&mut *a, &mut *b] {
                let mut updates = Vec::new();
                for id in 1..=3 {
                    for (key, ..) in runs_of_on(s, ExecutorId(id)).into_iter().take(2) {
                        updates.push(StatusUpdate {
                            executor: ExecutorId(id),
                            ..finished_on_1(key)
                        });
                    }
                }
                s.handle_statuses(updates, now_us + 50);
            }
        }
    }
    assert!(launched > 300, "jobs ran: {launched}");
    assert_eq!(a.stats(), b.stats());
}

#[test]
fn an_id_of_an_active_job_is_refused_and_any_other_accepted() {
    let mut s = with_executor(1);
    s.handle_submit_with_id(JobId(5), same(2), 0)
        .expect("a fresh id");
    let refused = s.handle_submit_with_id(JobId(5), same(1), 0);
    assert!(
        matches!(refused, Err(SubmitError::DuplicateJob(JobId(5)))),
        "{refused:?}"
    );
    // Below the highest id seen, but no active job's: accepted.
    s.handle_submit_with_id(JobId(3), same(1), 0)
        .expect("an id no active job has");
    let refused = s.handle_submit_with_id(JobId(3), same(1), 0);
    assert!(
        matches!(refused, Err(SubmitError::DuplicateJob(JobId(3)))),
        "{refused:?}"
    );
    let too_big = JobId(u64::from(u32::MAX) + 1);
    let refused = s.handle_submit_with_id(too_big, same(1), 0);
    assert!(
        matches!(refused, Err(SubmitError::DuplicateJob(_))),
        "{refused:?}"
    );
    // Past every id seen: accepted without a lookup; the next `handle_submit` picks above it.
    s.handle_submit_with_id(JobId(9), same(1), 0)
        .expect("a fresh id");
    assert_eq!(s.handle_submit(same(1), 0).ok(), Some(JobId(10)));
}

#[test]
fn jobs_waiting_in_the_line_launch_as_a_walk_would_launch_them() {
    line_against_walk(&[(1, 1), (2, 3), (3, 2)]);
}

#[test]
fn jobs_waiting_in_the_line_fill_an_executor_alone_as_a_walk_would() {
    // One executor, offered alone: it takes the next jobs' tasks at once (`fill_from_line`).
    line_against_walk(&[(1, 16)]);
}

/// Two schedulers with hedging and a slow start of 2 slots over `executors` (id, cores): the
/// second walks for every assignment, the reference the first's shortcuts must match.
fn walk_pair(executors: &[(u64, u32)]) -> [Scheduler; 2] {
    [false, true].map(|walk_only| {
        let mut s = Scheduler::new(Config {
            slow_start_slots: 2,
            hedging: Some(HedgeConfig::default()),
            ..Config::default()
        });
        s.walk_only = walk_only;
        for &(id, cores) in executors {
            s.handle_register(executor(id, cores), 0)
                .expect("registered");
        }
        s
    })
}

/// Bursts of one-task jobs over `executors` (id, cores) wait in the line (`line.rs`); now and
/// then a job of a higher priority or of two tasks, a cancel, a kill, an executor leaving or
/// joining empties it into the order or leaves dead entries behind. Each round, what was
/// launched (which task, where, how), the events and the stats are those of a scheduler that
/// walks for every assignment.
fn line_against_walk(executors: &[(u64, u32)]) {
    let mut pair = walk_pair(executors);
    let [a, b] = &mut pair;
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut draw = move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    let mut executors: Vec<u64> = executors.iter().map(|&(id, _)| id).collect();
    let mut next_executor = 10;
    let (mut line_peak, mut lined_rounds, mut launched) = (0, 0, 0);
    for round in 0..600u64 {
        let now_us = round * 100;
        // Busy spells (more jobs than the executors finish), each followed by a quiet one that
        // lets the jobs waiting drain, so a line forms again and again.
        let quiet = round % 16 >= 12;
        let burst = if quiet { 0 } else { draw(9) };
        let specs: Vec<JobSpec> = (0..burst)
            .map(|_| {
                let mut spec = same(if draw(80) == 0 { 2 } else { 1 });
                spec.priority = i32::from(draw(80) == 0);
                spec.keep_results = draw(2) == 0;
                spec
            })
            .collect();
        let recent = JobId(a.next_job.saturating_sub(1 + draw(12)));
        let (cancel, kill) = (draw(8) == 0, draw(16) == 0);
        let leave = (draw(60) == 0 && executors.len() > 1).then(|| executors.remove(0));
        let join = (draw(40) == 0).then(|| {
            next_executor += 1;
            executors.push(next_executor);
            next_executor
        });
        let finish: Vec<u64> = (executors.iter())
            .map(|_| if quiet { 3 } else { draw(3) })
            .collect();
        for s in [&mut *a, &mut *b] {
            for spec in specs.iter().cloned() {
                s.handle_submit(spec, now_us).expect("accepted");
            }
            if cancel {
                s.handle_cancel(recent, now_us);
            }
            if kill {
                s.handle_kill(TaskId::new(recent, 0), "killed", now_us);
            }
            if let Some(id) = leave {
                let reason = RemovalReason::Lost("gone".into());
                s.handle_remove(ExecutorId(id), reason, now_us);
            }
            if let Some(id) = join {
                s.handle_register(executor(id, 2), now_us)
                    .expect("registered");
            }
        }
        line_peak = line_peak.max(a.line.len());
        lined_rounds += usize::from(!a.line.is_empty());
        let got = launch_outputs(a);
        assert_eq!(got, launch_outputs(b), "the same launches in round {round}");
        launched += got.iter().map(|(_, tasks)| tasks.len()).sum::<usize>();
        let events = |s: &mut Scheduler| std::iter::from_fn(|| s.poll_event()).collect::<Vec<_>>();
        assert_eq!(events(a), events(b), "round {round}");
        assert_eq!(a.stats(), b.stats(), "round {round}");
        for s in [&mut *a, &mut *b] {
            let mut updates = Vec::new();
            for (&id, &n) in executors.iter().zip(&finish) {
                for (key, ..) in runs_of_on(s, ExecutorId(id)).into_iter().take(n as usize) {
                    updates.push(StatusUpdate {
                        executor: ExecutorId(id),
                        ..finished_on_1(key)
                    });
                }
            }
            s.handle_statuses(updates, now_us + 50);
        }
    }
    assert!(
        line_peak > 10,
        "jobs waited in the line: at most {line_peak}"
    );
    assert!(
        lined_rounds > 50,
        "jobs waited in the line in {lined_rounds} rounds"
    );
    assert!(launched > 1000, "jobs ran: {launched}");
    assert_eq!(a.stats(), b.stats());
}
