//! Behaviour of the scheduler state machine, one property per test, driven through its public
//! API only (as the driver will).

use bytes::Bytes;
use flint_engine::scheduler::{
    Config, Event, ExclusionConfig, ExecutorId, ExecutorInfo, JobId, JobOutcome, JobSetting,
    JobSpec, LocalityLevel, Output, PoolConfig, Refusal, RemovalReason, Scheduler, Sharing,
    SpeculationConfig, StatusUpdate, SubmitError, TaskId, TaskLaunch, TaskSpec, TaskState,
    TaskStatus, Tasks,
};

/// The defaults without exclusion and speculation (on by default; these tests look at other
/// things, some at exact `poll_timeout`s, which speculation's checks would move).
fn config() -> Config {
    Config {
        exclusion: None,
        speculation: None,
        ..Config::default()
    }
}

fn exec(id: u64, host: &str, cores: u32) -> ExecutorInfo {
    ExecutorInfo {
        id: ExecutorId(id),
        host: host.into(),
        cores,
        attributes: Vec::new(),
    }
}

fn tasks(n: usize) -> Vec<TaskSpec> {
    (0..n)
        .map(|i| TaskSpec::new("f", Bytes::from(vec![i as u8])))
        .collect()
}

fn drain(s: &mut Scheduler) -> Vec<Output> {
    let mut v = Vec::new();
    s.drain_outputs(&mut v);
    v
}

fn launches(outs: &[Output]) -> Vec<(ExecutorId, TaskLaunch)> {
    outs.iter()
        .filter_map(|o| match o {
            Output::Launch { executor, tasks } => Some((*executor, tasks.clone())),
            _ => None,
        })
        .flat_map(|(e, ts)| ts.into_iter().map(move |t| (e, t)))
        .collect()
}

/// Each launched attempt's report that it finished with an empty result.
fn finished(launched: &[(ExecutorId, TaskLaunch)]) -> Vec<StatusUpdate> {
    (launched.iter())
        .map(|(e, l)| StatusUpdate {
            executor: *e,
            task: l.task,
            attempt: l.attempt,
            state: TaskState::Finished,
            data: Bytes::new(),
        })
        .collect()
}

/// The events among `outs`, an [`Event::OneTaskJobSucceeded`] as the result and the outcome
/// it stands for.
fn events(outs: &[Output]) -> impl Iterator<Item = Event> + '_ {
    (outs.iter())
        .filter_map(|o| match o {
            Output::Event(event) => Some(event.clone()),
            _ => None,
        })
        .flat_map(Event::split)
}

fn results(outs: &[Output]) -> Vec<(TaskId, Result<Bytes, String>)> {
    events(outs)
        .filter_map(|e| match e {
            Event::TaskResult { task, result } => Some((task, result)),
            _ => None,
        })
        .collect()
}

fn outcomes(outs: &[Output]) -> Vec<(JobId, JobOutcome)> {
    events(outs)
        .filter_map(|e| match e {
            Event::JobOutcome { job, outcome } => Some((job, outcome)),
            _ => None,
        })
        .collect()
}

fn kills(outs: &[Output]) -> Vec<(ExecutorId, TaskId, u32)> {
    outs.iter()
        .filter_map(|o| match o {
            Output::Kill {
                executor,
                task,
                attempt,
                ..
            } => Some((*executor, *task, *attempt)),
            _ => None,
        })
        .collect()
}

fn update(
    s: &mut Scheduler,
    now: u64,
    e: ExecutorId,
    l: &TaskLaunch,
    state: TaskState,
    data: &[u8],
) {
    s.handle_status(
        StatusUpdate {
            executor: e,
            task: l.task,
            attempt: l.attempt,
            state,
            data: Bytes::copy_from_slice(data),
        },
        now,
    );
}

#[test]
fn registration_refuses_duplicates_zero_cores_and_a_full_table() {
    let mut s = Scheduler::new(Config {
        executors_max: 2,
        ..config()
    });
    assert_eq!(s.handle_register(exec(1, "h", 2), 0), Ok(()));
    assert_eq!(
        s.handle_register(exec(1, "h", 2), 0),
        Err(Refusal::DuplicateId(ExecutorId(1)))
    );
    assert_eq!(
        s.handle_register(exec(2, "h", 0), 0),
        Err(Refusal::ZeroCores)
    );
    assert_eq!(s.handle_register(exec(2, "h", 1), 0), Ok(()));
    assert_eq!(
        s.handle_register(exec(3, "h", 1), 0),
        Err(Refusal::TooManyExecutors(2))
    );
    assert_eq!(s.executors(), 2);
    assert!(s.handle_remove(ExecutorId(1), RemovalReason::Killed, 0));
    assert!(!s.handle_remove(ExecutorId(1), RemovalReason::Killed, 0));
    assert_eq!(s.handle_register(exec(3, "h", 1), 0), Ok(()));
}

#[test]
fn tasks_spread_over_executors_and_cores_are_never_oversubscribed() {
    let mut s = Scheduler::new(config());
    for i in 0..4 {
        s.handle_register(exec(i, "h", 2), 0).unwrap();
    }
    let job = s.handle_submit(JobSpec::new(tasks(10)), 0).unwrap();
    let outs = drain(&mut s);
    let ls = launches(&outs);
    assert_eq!(ls.len(), 8, "8 cores, 8 launches");
    for i in 0..4 {
        let on_i = ls.iter().filter(|(e, _)| *e == ExecutorId(i)).count();
        assert_eq!(on_i, 2, "executor {i} gets its 2 cores' worth");
        assert_eq!(s.executor_cores(ExecutorId(i)), Some((2, 0)));
    }
    // Launches are batched: one Launch output per executor.
    let batches = outs
        .iter()
        .filter(|o| matches!(o, Output::Launch { .. }))
        .count();
    assert_eq!(batches, 4);
    // Round-robin: the first four launches hit four different executors.
    let first: std::collections::BTreeSet<_> = outs
        .iter()
        .filter_map(|o| match o {
            Output::Launch { executor, .. } => Some(*executor),
            _ => None,
        })
        .collect();
    assert_eq!(first.len(), 4);
    assert_eq!(s.pending_tasks(), 2);
    // A completion frees a core on that executor and the next task goes there.
    let (e, l) = ls[0].clone();
    update(&mut s, 1, e, &l, TaskState::Finished, b"r");
    let outs = drain(&mut s);
    let next = launches(&outs);
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].0, e);
    assert_eq!(results(&outs), vec![(l.task, Ok(Bytes::from_static(b"r")))]);
    assert_eq!(s.job_pending_tasks(job), Some(1));
}

#[test]
fn multi_core_tasks_take_their_cores() {
    let mut s = Scheduler::new(config());
    s.handle_register(exec(1, "h", 4), 0).unwrap();
    let mut ts = tasks(3);
    for t in &mut ts {
        t.cores = 3;
    }
    s.handle_submit(JobSpec::new(ts), 0).unwrap();
    let ls = launches(&drain(&mut s));
    assert_eq!(ls.len(), 1, "only one 3-core task fits in 4 cores");
    assert_eq!(ls[0].1.cores, 3);
    assert_eq!(s.executor_cores(ExecutorId(1)), Some((4, 1)));
    update(&mut s, 1, ls[0].0, &ls[0].1, TaskState::Finished, b"");
    assert_eq!(launches(&drain(&mut s)).len(), 1);
    assert_eq!(s.executor_cores(ExecutorId(1)), Some((4, 1)));
}

#[test]
fn fifo_runs_higher_priority_first_then_submission_order() {
    let mut s = Scheduler::new(config());
    let low = s.handle_submit(JobSpec::new(tasks(2)), 0).unwrap();
    let mut spec = JobSpec::new(tasks(2));
    spec.priority = 5;
    let high = s.handle_submit(spec, 0).unwrap();
    let later = s.handle_submit(JobSpec::new(tasks(2)), 0).unwrap();
    s.handle_register(exec(1, "h", 6), 0).unwrap();
    let order: Vec<JobId> = launches(&drain(&mut s))
        .iter()
        .map(|(_, l)| l.task.job())
        .collect();
    assert_eq!(order, vec![high, high, low, low, later, later]);
}

#[test]
fn fair_sharing_splits_cores_by_pool_weight() {
    let mut s = Scheduler::new(Config {
        sharing: Sharing::Fair,
        pools: vec![
            PoolConfig {
                weight: 1,
                ..PoolConfig::new("small")
            },
            PoolConfig {
                weight: 3,
                ..PoolConfig::new("big")
            },
        ],
        ..config()
    });
    let mut a = JobSpec::new(tasks(100));
    a.pool = "small".into();
    let mut b = JobSpec::new(tasks(100));
    b.pool = "big".into();
    let ja = s.handle_submit(a, 0).unwrap();
    let jb = s.handle_submit(b, 0).unwrap();
    s.handle_register(exec(1, "h", 8), 0).unwrap();
    let ls = launches(&drain(&mut s));
    let na = ls.iter().filter(|(_, l)| l.task.job() == ja).count();
    let nb = ls.iter().filter(|(_, l)| l.task.job() == jb).count();
    assert_eq!((na, nb), (2, 6), "weights 1:3 over 8 cores");
}

#[test]
fn locality_prefers_executor_then_host_then_any_after_the_waits() {
    let mut s = Scheduler::new(Config {
        locality_wait_executor_us: 100,
        locality_wait_host_us: 100,
        ..config()
    });
    s.handle_register(exec(1, "ha", 1), 0).unwrap();
    s.handle_register(exec(2, "ha", 1), 0).unwrap();
    s.handle_register(exec(3, "hb", 1), 0).unwrap();
    // Occupy executor 1 so the tasks preferring it must wait or move.
    s.handle_submit(JobSpec::new(tasks(1)), 0).unwrap();
    let first = launches(&drain(&mut s));
    let busy = first[0].0;
    assert_eq!(
        busy,
        ExecutorId(1),
        "rotation starts at the first executor with seed 0"
    );
    let mut ts = tasks(2);
    for t in &mut ts {
        t.preferred_executors.push(ExecutorId(1));
    }
    s.handle_submit(JobSpec::new(ts), 10).unwrap();
    assert!(
        launches(&drain(&mut s)).is_empty(),
        "within the executor wait"
    );
    assert_eq!(s.poll_timeout(), Some(110));
    s.handle_timeout(110);
    let ls = launches(&drain(&mut s));
    assert_eq!(
        ls.len(),
        1,
        "host level: only the other executor on host ha"
    );
    assert_eq!(ls[0].0, ExecutorId(2));
    assert_eq!(s.poll_timeout(), Some(210));
    s.handle_timeout(209);
    assert!(launches(&drain(&mut s)).is_empty());
    s.handle_timeout(210);
    let ls = launches(&drain(&mut s));
    assert_eq!(ls.len(), 1, "any level after both waits");
    assert_eq!(ls[0].0, ExecutorId(3));
}

#[test]
fn a_host_level_found_to_have_no_task_left_ends_in_the_asking_that_finds_it_out() {
    // Executor 2 (on h2) runs a blocker. A job of priority waits for an executor of two
    // cores (so it is first in line, but asks nothing of executor 2). The located job's
    // task 0 prefers h2, task 1 a host no executor is on; task 0 is killed, which leaves h2's
    // queue holding only a stale entry. When the blocker ends, executor 2's asking drops that
    // entry: the host level has nothing left to wait for, so the same asking goes on at the
    // any level and executor 2 takes task 1 at once, not at some later offer.
    let mut s = Scheduler::new(config());
    s.handle_register(exec(2, "h2", 1), 0).unwrap();
    s.handle_submit(JobSpec::new(tasks(1)), 0).unwrap();
    let blocker = launches(&drain(&mut s));
    let wide = vec![TaskSpec {
        cores: 2,
        ..TaskSpec::new("f", Bytes::new())
    }];
    let first = JobSpec {
        priority: 5,
        ..JobSpec::new(wide)
    };
    s.handle_submit(first, 1).unwrap();
    let mut ts = tasks(2);
    ts[0].preferred_hosts.push("h2".into());
    ts[1].preferred_hosts.push("h9".into());
    let job = s.handle_submit(JobSpec::new(ts), 2).unwrap();
    assert!(s.handle_kill(TaskId::new(job, 0), "test", 3));
    drain(&mut s);
    s.handle_statuses(finished(&blocker), 4);
    let placed: Vec<(ExecutorId, u32)> = (launches(&drain(&mut s)).into_iter())
        .map(|(e, l)| (e, l.task.index()))
        .collect();
    assert_eq!(placed, [(ExecutorId(2), 1)]);
    let info = s.job_info(job).expect("active");
    assert_eq!(info.locality_level, LocalityLevel::Any, "{info:?}");
}

#[test]
fn a_task_naming_more_hosts_than_a_record_keeps_in_place_runs_on_any_of_them() {
    // Four names or more take the preferences' other form: the last one must count too.
    for names in [3, 4, 7] {
        let mut s = Scheduler::new(Config {
            locality_wait_host_us: 1_000_000,
            ..config()
        });
        s.handle_register(exec(1, "ha", 1), 0).unwrap();
        s.handle_register(exec(2, "hb", 1), 0).unwrap();
        let mut ts = tasks(1);
        ts[0].preferred_hosts = (1..names).map(|i| format!("nowhere-{i}").into()).collect();
        ts[0].preferred_hosts.push("hb".into());
        s.handle_submit(JobSpec::new(ts), 0).unwrap();
        let ls = launches(&drain(&mut s));
        assert_eq!(ls.len(), 1, "{names} hosts named");
        assert_eq!(ls[0].0, ExecutorId(2), "on the host named last of {names}");
    }
}

#[test]
fn preferred_executor_gets_its_task_at_once() {
    let mut s = Scheduler::new(Config {
        locality_wait_executor_us: 1_000_000,
        ..config()
    });
    for i in 1..=3 {
        s.handle_register(exec(i, "h", 1), 0).unwrap();
    }
    let mut ts = tasks(1);
    ts[0].preferred_executors.push(ExecutorId(3));
    s.handle_submit(JobSpec::new(ts), 0).unwrap();
    let ls = launches(&drain(&mut s));
    assert_eq!(ls.len(), 1);
    assert_eq!(ls[0].0, ExecutorId(3));
}

#[test]
fn a_task_is_retried_until_max_failures_then_the_job_fails_with_the_reasons() {
    let mut s = Scheduler::new(Config {
        max_failures: 3,
        ..config()
    });
    s.handle_register(exec(1, "h", 1), 0).unwrap();
    let job = s.handle_submit(JobSpec::new(tasks(2)), 0).unwrap();
    let mut kept = Vec::new();
    let mut failed_attempts = Vec::new();
    let mut outs = drain(&mut s);
    while outcomes(&kept).is_empty() {
        let ls = launches(&outs);
        assert!(ls.len() <= 1, "one core");
        kept.extend(
            outs.into_iter()
                .filter(|o| !matches!(o, Output::Launch { .. })),
        );
        for (e, l) in ls {
            let msg = format!("boom {}-{}", l.task.index(), l.attempt);
            failed_attempts.push((l.task.index(), l.attempt));
            update(&mut s, 1, e, &l, TaskState::Failed, msg.as_bytes());
        }
        outs = drain(&mut s);
        assert!(failed_attempts.len() < 10, "must end");
    }
    kept.extend(outs);
    // Alternating retries; task 0 reaches 3 failures first.
    assert_eq!(
        failed_attempts,
        vec![(0, 0), (1, 0), (0, 1), (1, 1), (0, 2)]
    );
    // The task that failed the job reports its failure; the other ends without a result.
    let res = results(&kept);
    assert_eq!(res.len(), 1, "{res:?}");
    assert_eq!(res[0].0.index(), 0);
    assert!(res[0]
        .1
        .as_ref()
        .is_err_and(|e| e.contains("task 0 failed 3 times")));
    let outs = outcomes(&kept);
    assert_eq!(outs.len(), 1);
    assert_eq!(outs[0].0, job);
    match &outs[0].1 {
        JobOutcome::Failed(reasons) => {
            assert!(reasons[0].contains("task 0 failed 3 times"), "{reasons:?}");
            for i in 0..3 {
                let boom = format!("boom 0-{i}");
                assert!(reasons.iter().any(|r| r.contains(&boom)), "{reasons:?}");
            }
        }
        other => panic!("expected failure, got {other:?}"),
    }
    assert_eq!(s.active_jobs(), 0);
    assert_eq!(s.unfinished_tasks(), 0);
    assert_eq!(s.executor_cores(ExecutorId(1)), Some((1, 1)));
}

#[test]
fn executor_loss_requeues_its_tasks_without_counting_unless_the_app_caused_it() {
    let mut s = Scheduler::new(Config {
        max_failures: 1,
        ..config()
    });
    s.handle_register(exec(1, "h", 2), 0).unwrap();
    s.handle_register(exec(2, "h", 2), 0).unwrap();
    let job = s.handle_submit(JobSpec::new(tasks(4)), 0).unwrap();
    let ls = launches(&drain(&mut s));
    assert_eq!(ls.len(), 4);
    let on_1: Vec<TaskId> = ls
        .iter()
        .filter(|(e, _)| *e == ExecutorId(1))
        .map(|(_, l)| l.task)
        .collect();
    // Lost: not the tasks' fault, so max_failures = 1 does not fail the job.
    assert!(s.handle_remove(ExecutorId(1), RemovalReason::Lost("gone".into()), 1));
    assert!(
        drain(&mut s).is_empty(),
        "no free cores elsewhere, nothing reported"
    );
    assert_eq!(s.job_pending_tasks(job), Some(2));
    s.handle_register(exec(3, "h", 2), 2).unwrap();
    let again = launches(&drain(&mut s));
    let mut relaunched: Vec<TaskId> = again.iter().map(|(_, l)| l.task).collect();
    relaunched.sort();
    assert_eq!(
        relaunched, on_1,
        "exactly the lost executor's tasks come back"
    );
    assert!(again
        .iter()
        .all(|(e, l)| *e == ExecutorId(3) && l.attempt == 1));
    // Exit caused by the app counts: with max_failures = 1 the job fails.
    assert!(s.handle_remove(
        ExecutorId(3),
        RemovalReason::Exited {
            code: 137,
            caused_by_app: true
        },
        3
    ));
    let outs = drain(&mut s);
    let out = outcomes(&outs);
    assert_eq!(out.len(), 1);
    assert!(matches!(&out[0].1, JobOutcome::Failed(r) if r.iter().any(|r| r.contains("code 137"))));
    // The job's tasks still running on executor 2 are asked to stop.
    assert_eq!(kills(&outs).len(), 2);
    assert!(kills(&outs).iter().all(|(e, _, _)| *e == ExecutorId(2)));
    // Only the task whose failure ended the job has a result.
    let res = results(&outs);
    assert_eq!(res.len(), 1, "{res:?}");
    assert!(res[0].1.is_err());
}

#[test]
fn a_task_reported_lost_removes_its_executor() {
    let mut s = Scheduler::new(config());
    s.handle_register(exec(1, "h", 1), 0).unwrap();
    s.handle_submit(JobSpec::new(tasks(1)), 0).unwrap();
    let ls = launches(&drain(&mut s));
    update(&mut s, 1, ls[0].0, &ls[0].1, TaskState::Lost, b"");
    assert_eq!(s.executors(), 0);
    assert_eq!(s.pending_tasks(), 1);
}

#[test]
fn stale_duplicate_and_unknown_updates_are_ignored_and_counted() {
    let mut s = Scheduler::new(config());
    s.handle_register(exec(1, "h", 2), 0).unwrap();
    s.handle_register(exec(2, "h", 2), 0).unwrap();
    s.handle_submit(JobSpec::new(tasks(2)), 0).unwrap();
    let ls = launches(&drain(&mut s));
    let (e, l) = ls[0].clone();
    let other = if e == ExecutorId(1) {
        ExecutorId(2)
    } else {
        ExecutorId(1)
    };
    // The wrong executor claims the task.
    update(&mut s, 1, other, &l, TaskState::Finished, b"fake");
    // An unknown executor, an unknown task, a future attempt.
    update(&mut s, 1, ExecutorId(99), &l, TaskState::Finished, b"x");
    let mut bogus = l.clone();
    bogus.task = TaskId(u64::MAX);
    update(&mut s, 1, e, &bogus, TaskState::Failed, b"x");
    let mut future = l.clone();
    future.attempt = 7;
    update(&mut s, 1, e, &future, TaskState::Killed, b"x");
    update(&mut s, 1, e, &future, TaskState::Running, b"x");
    assert_eq!(s.stats().ignored_updates, 5);
    assert!(drain(&mut s).is_empty());
    // The real one, then a duplicate.
    update(&mut s, 2, e, &l, TaskState::Finished, b"real");
    update(&mut s, 2, e, &l, TaskState::Finished, b"again");
    let outs = drain(&mut s);
    assert_eq!(
        results(&outs),
        vec![(l.task, Ok(Bytes::from_static(b"real")))]
    );
    assert_eq!(s.stats().ignored_updates, 6);
    assert_eq!(s.executor_cores(e), Some((2, 2)));
}

#[test]
fn cancel_kills_running_drops_pending_and_reports_once() {
    let mut s = Scheduler::new(config());
    s.handle_register(exec(1, "h", 2), 0).unwrap();
    let job = s.handle_submit(JobSpec::new(tasks(5)), 0).unwrap();
    let ls = launches(&drain(&mut s));
    update(&mut s, 1, ls[0].0, &ls[0].1, TaskState::Finished, b"done");
    let first = drain(&mut s);
    assert_eq!(results(&first).len(), 1);
    assert!(s.handle_cancel(job, 2));
    assert!(!s.handle_cancel(job, 3), "only once");
    let outs = drain(&mut s);
    assert_eq!(kills(&outs).len(), 2, "the two running attempts");
    assert_eq!(
        results(&outs),
        vec![],
        "unfinished tasks end without a result"
    );
    assert_eq!(outcomes(&outs), vec![(job, JobOutcome::Cancelled)]);
    assert_eq!(s.pending_tasks(), 0);
    // Cores come back when the executor confirms the kills.
    assert_eq!(s.executor_cores(ExecutorId(1)), Some((2, 0)));
    for (e, t, a) in kills(&outs) {
        s.handle_status(
            StatusUpdate {
                executor: e,
                task: t,
                attempt: a,
                state: TaskState::Killed,
                data: Bytes::new(),
            },
            3,
        );
    }
    assert_eq!(s.executor_cores(ExecutorId(1)), Some((2, 2)));
    assert!(drain(&mut s).is_empty(), "nothing reported twice");
}

#[test]
fn killing_a_task_reports_it_failed_and_the_job_fails_when_the_rest_finish() {
    let mut s = Scheduler::new(config());
    s.handle_register(exec(1, "h", 1), 0).unwrap();
    let job = s.handle_submit(JobSpec::new(tasks(2)), 0).unwrap();
    let ls = launches(&drain(&mut s));
    assert!(
        s.handle_kill(TaskId::new(job, 1), "not needed", 1),
        "a pending task"
    );
    assert!(!s.handle_kill(TaskId::new(job, 1), "again", 1));
    let outs = drain(&mut s);
    assert_eq!(
        results(&outs),
        vec![(TaskId::new(job, 1), Err("killed: not needed".to_string()))]
    );
    update(&mut s, 2, ls[0].0, &ls[0].1, TaskState::Finished, b"ok");
    let outs = drain(&mut s);
    assert_eq!(results(&outs).len(), 1);
    let out = outcomes(&outs);
    assert!(
        matches!(&out[..], [(j, JobOutcome::Failed(r))] if *j == job && r[0].contains("killed"))
    );
}

#[test]
fn killing_a_running_task_asks_its_executor() {
    let mut s = Scheduler::new(config());
    s.handle_register(exec(1, "h", 1), 0).unwrap();
    let job = s.handle_submit(JobSpec::new(tasks(1)), 0).unwrap();
    let ls = launches(&drain(&mut s));
    assert!(s.handle_kill(ls[0].1.task, "stop", 1));
    let outs = drain(&mut s);
    assert_eq!(kills(&outs), vec![(ExecutorId(1), ls[0].1.task, 0)]);
    assert_eq!(outcomes(&outs).len(), 1);
    assert_eq!(outcomes(&outs)[0].0, job);
    // A late FINISHED does not resurrect it, but frees the core.
    update(&mut s, 2, ls[0].0, &ls[0].1, TaskState::Finished, b"late");
    assert!(drain(&mut s).is_empty());
    assert_eq!(s.executor_cores(ExecutorId(1)), Some((1, 1)));
}

/// The same limits hold for a job given as one function over its payloads (`Tasks::Same`, what
/// the driver sends): zero cores is refused, an oversized payload fails the job naming the
/// task, and the tasks run that function with those cores.
#[test]
fn a_job_of_one_function_over_payloads_keeps_the_limits_and_runs_each_payload() {
    let same = |cores, payloads: Vec<&'static [u8]>| {
        JobSpec::new(Tasks::Same {
            function: "f".into(),
            cores,
            payloads: payloads.into_iter().map(Bytes::from_static).collect(),
        })
    };
    let mut s = Scheduler::new(Config {
        payload_max_bytes: 4,
        ..config()
    });
    s.handle_register(exec(1, "h", 4), 0).unwrap();
    assert_eq!(
        s.handle_submit(same(0, vec![b"a"]), 0).unwrap_err(),
        SubmitError::ZeroCores(0)
    );
    let job = s.handle_submit(same(1, vec![b"a", b"12345"]), 0).unwrap();
    match &outcomes(&drain(&mut s))[..] {
        [(j, JobOutcome::Failed(r))] => {
            assert_eq!(*j, job);
            assert!(r[0].contains("task 1 payload is 5 bytes, over payload_max_bytes = 4"));
        }
        other => panic!("{other:?}"),
    }
    s.handle_submit(same(2, vec![b"x", b"y"]), 0).unwrap();
    let ls = launches(&drain(&mut s));
    let mut seen: Vec<_> = ls
        .iter()
        .map(|(_, l)| (l.task.index(), &*l.function, l.cores, l.payload.clone()))
        .collect();
    seen.sort_by_key(|t| t.0);
    assert_eq!(
        seen,
        vec![
            (0, "f", 2, Bytes::from_static(b"x")),
            (1, "f", 2, Bytes::from_static(b"y"))
        ]
    );
}

/// A job whose tasks name their own functions launches each with its own; one function over
/// payloads launches every task with that one (above).
#[test]
fn tasks_naming_their_own_functions_launch_with_them() {
    let mut s = Scheduler::new(config());
    s.handle_register(exec(1, "h", 3), 0).unwrap();
    let specs = ["f", "g", "f"]
        .map(|f| TaskSpec::new(f, Bytes::new()))
        .to_vec();
    s.handle_submit(JobSpec::new(specs), 0).unwrap();
    let mut seen: Vec<_> = (launches(&drain(&mut s)).iter())
        .map(|(_, l)| (l.task.index(), l.function.to_string()))
        .collect();
    seen.sort();
    let expected = [(0, "f"), (1, "g"), (2, "f")].map(|(i, f)| (i, f.to_string()));
    assert_eq!(seen, expected);
}

#[test]
fn limits_refuse_or_fail_with_clear_errors() {
    let mut s = Scheduler::new(Config {
        pending_tasks_max: 3,
        payload_max_bytes: 4,
        jobs_max: 2,
        ..config()
    });
    assert_eq!(
        s.handle_submit(JobSpec::new(tasks(4)), 0).unwrap_err(),
        SubmitError::TooManyPending {
            active: 0,
            submitted: 4,
            limit: 3
        }
    );
    let mut zero = tasks(1);
    zero[0].cores = 0;
    assert_eq!(
        s.handle_submit(JobSpec::new(zero), 0).unwrap_err(),
        SubmitError::ZeroCores(0)
    );
    let mut big = tasks(2);
    big[1].payload = Bytes::from_static(b"12345");
    let job = s.handle_submit(JobSpec::new(big), 0).unwrap();
    let outs = drain(&mut s);
    assert_eq!(results(&outs), vec![], "no task ran");
    match &outcomes(&outs)[..] {
        [(j, JobOutcome::Failed(r))] => {
            assert_eq!(*j, job);
            assert!(r[0].contains("task 1 payload is 5 bytes, over payload_max_bytes = 4"));
        }
        other => panic!("{other:?}"),
    }
    s.handle_submit(JobSpec::new(tasks(1)), 0).unwrap();
    s.handle_submit(JobSpec::new(tasks(1)), 0).unwrap();
    assert_eq!(
        s.handle_submit(JobSpec::new(tasks(1)), 0).unwrap_err(),
        SubmitError::TooManyJobs(2)
    );
    // An empty job succeeds at once.
    let mut s = Scheduler::new(config());
    let job = s.handle_submit(JobSpec::new(Vec::new()), 0).unwrap();
    assert_eq!(
        outcomes(&drain(&mut s)),
        vec![(job, JobOutcome::Succeeded(Vec::new()))]
    );
}

#[test]
fn a_job_succeeds_with_its_results_in_task_order() {
    let mut s = Scheduler::new(config());
    s.handle_register(exec(1, "h", 3), 0).unwrap();
    let job = s.handle_submit(JobSpec::new(tasks(3)), 0).unwrap();
    let mut ls = launches(&drain(&mut s));
    ls.reverse();
    let mut outs = Vec::new();
    for (e, l) in &ls {
        update(
            &mut s,
            1,
            *e,
            l,
            TaskState::Finished,
            &[l.task.index() as u8 + 10],
        );
        outs.extend(drain(&mut s));
    }
    let expected: Vec<Bytes> = (0..3u8).map(|i| Bytes::from(vec![i + 10])).collect();
    assert_eq!(
        outcomes(&outs),
        vec![(job, JobOutcome::Succeeded(expected))]
    );
    assert!(
        matches!(outs.last(), Some(Output::Event(Event::JobOutcome { .. }))),
        "outcome last"
    );
}

/// Results replace payloads in every form a job's payloads come in (one, a vector, a list
/// jobs share), in task order, and a failed attempt's retry still gets its payload; a list
/// the caller shares is left as it was.
#[test]
fn results_come_in_task_order_whatever_form_the_payloads_came_in() {
    let inputs: Vec<Bytes> = (0..3u8).map(|i| Bytes::from(vec![i])).collect();
    let shared: std::sync::Arc<[Bytes]> = inputs.clone().into();
    let forms: [flint_engine::scheduler::Payloads; 3] = [
        inputs.clone().into(),
        shared.clone().into(),
        inputs[0].clone().into(),
    ];
    for payloads in forms {
        let n = payloads.len();
        let mut s = Scheduler::new(config());
        s.handle_register(exec(1, "h", 3), 0).unwrap();
        let spec = JobSpec::new(Tasks::Same {
            function: "f".into(),
            cores: 1,
            payloads,
        });
        let job = s.handle_submit(spec, 0).unwrap();
        let ls = launches(&drain(&mut s));
        let sent: Vec<Bytes> = ls.iter().map(|(_, l)| l.payload.clone()).collect();
        assert_eq!(sent, inputs[..n], "each task's own payload");
        // The first fails once: its retry carries its payload again.
        update(&mut s, 1, ls[0].0, &ls[0].1, TaskState::Failed, b"boom");
        let retry = launches(&drain(&mut s));
        assert_eq!(retry.len(), 1);
        assert_eq!(retry[0].1.payload, inputs[0]);
        let mut outs = Vec::new();
        for (e, l) in retry.iter().chain(ls.iter().skip(1)).rev() {
            let result = [l.task.index() as u8 + 10];
            update(&mut s, 2, *e, l, TaskState::Finished, &result);
            outs.extend(drain(&mut s));
        }
        let expected: Vec<Bytes> = (0..n as u8).map(|i| Bytes::from(vec![i + 10])).collect();
        assert_eq!(
            outcomes(&outs),
            vec![(job, JobOutcome::Succeeded(expected))]
        );
    }
    assert_eq!(
        shared[..],
        inputs[..],
        "the shared list is the caller's as it was"
    );
}

/// A driver takes the executors' part (launches, kills) with `poll_command` and the callers'
/// part (results, outcomes) with `poll_event`; `poll_output` gives the first, then the second.
#[test]
fn a_one_task_job_that_keeps_no_results_succeeds_in_one_event() {
    let mut s = Scheduler::new(config());
    s.handle_register(exec(1, "h", 4), 0).unwrap();
    let plain = |n: usize, keep_results: bool| JobSpec {
        keep_results,
        ..JobSpec::new(tasks(n))
    };
    let one = s.handle_submit(plain(1, false), 0).unwrap();
    let kept = s.handle_submit(plain(1, true), 0).unwrap();
    let two = s.handle_submit(plain(2, false), 0).unwrap();
    let launched = launches(&drain(&mut s));
    assert_eq!(launched.len(), 4, "four cores, four tasks");
    s.handle_statuses(finished(&launched), 1);
    let mut events = Vec::new();
    while let Some(event) = s.poll_event() {
        events.push(event);
    }
    // The one-task job that keeps no results: one event, the result and the success.
    let ones: Vec<&Event> = (events.iter())
        .filter(|e| matches!(e, Event::OneTaskJobSucceeded { .. }))
        .collect();
    assert!(
        matches!(ones[..], [Event::OneTaskJobSucceeded { task, .. }] if *task == TaskId::new(one, 0)),
        "{events:?}"
    );
    // The others: a result per task, then the outcome (the kept results in it).
    let of = |job: JobId| -> Vec<&Event> {
        (events.iter())
            .filter(|e| match e {
                Event::TaskResult { task, .. } => task.job() == job,
                Event::JobOutcome { job: j, .. } => *j == job,
                Event::OneTaskJobSucceeded { task, .. } => task.job() == job,
            })
            .collect()
    };
    assert!(
        matches!(of(kept)[..], [
        Event::TaskResult { result: Ok(_), .. },
        Event::JobOutcome { outcome: JobOutcome::Succeeded(results), .. },
    ] if results.len() == 1),
        "{events:?}"
    );
    assert!(
        matches!(of(two)[..], [
        Event::TaskResult { result: Ok(_), .. },
        Event::TaskResult { result: Ok(_), .. },
        Event::JobOutcome { outcome: JobOutcome::Succeeded(results), .. },
    ] if results.is_empty()),
        "{events:?}"
    );
    assert_eq!(s.active_jobs(), 0);
    // Split, it says what the two events would.
    let split: Vec<Event> = ones[0].clone().split().collect();
    assert_eq!(
        split,
        vec![
            Event::TaskResult {
                task: TaskId::new(one, 0),
                result: Ok(Bytes::new())
            },
            Event::JobOutcome {
                job: one,
                outcome: JobOutcome::Succeeded(Vec::new())
            },
        ]
    );
}

#[test]
fn a_one_task_job_that_fails_reports_its_result_then_its_outcome() {
    let mut s = Scheduler::new(Config {
        max_failures: 1,
        ..config()
    });
    s.handle_register(exec(1, "h", 1), 0).unwrap();
    let spec = JobSpec {
        keep_results: false,
        ..JobSpec::new(tasks(1))
    };
    let job = s.handle_submit(spec, 0).unwrap();
    let launched = launches(&drain(&mut s));
    let mut failed = finished(&launched);
    failed[0].state = TaskState::Failed;
    s.handle_statuses(failed, 1);
    let mut events = Vec::new();
    while let Some(event) = s.poll_event() {
        events.push(event);
    }
    assert!(
        matches!(&events[..], [
        Event::TaskResult { task, result: Err(_) },
        Event::JobOutcome { job: j, outcome: JobOutcome::Failed(_) },
    ] if *task == TaskId::new(job, 0) && *j == job),
        "{events:?}"
    );
}

#[test]
fn commands_and_events_leave_apart_each_in_order() {
    let mut s = Scheduler::new(config());
    s.handle_register(exec(1, "h", 1), 0).unwrap();
    let job = s.handle_submit(JobSpec::new(tasks(2)), 0).unwrap();
    let first = launches(&drain(&mut s));
    assert_eq!(first.len(), 1, "one core, one launch");
    s.handle_status(finished(&first).remove(0), 1);
    // Task 0's result is decided before task 1's launch, yet the launch leaves first.
    let Some(Output::Launch { tasks: next, .. }) = s.poll_command() else {
        panic!("task 1's launch is the command");
    };
    assert_eq!(next[0].task, TaskId::new(job, 1));
    assert_eq!(s.poll_command(), None, "results are not commands");
    assert!(matches!(s.poll_event(),
        Some(Event::TaskResult { task, result: Ok(_) }) if task == TaskId::new(job, 0)));
    assert_eq!(s.poll_event(), None);
    let second = [(ExecutorId(1), next[0].clone())];
    s.handle_status(finished(&second).remove(0), 2);
    let outs = drain(&mut s);
    assert!(
        matches!(&outs[..], [
            Output::Event(Event::TaskResult { task, .. }),
            Output::Event(Event::JobOutcome { job: j, .. }),
        ] if *task == TaskId::new(job, 1) && *j == job),
        "the last result, then the outcome: {outs:?}"
    );
    assert_eq!(s.poll_output(), None);
}

#[test]
fn unschedulable_jobs_fail_instead_of_hanging() {
    let mut s = Scheduler::new(Config {
        unschedulable_timeout_us: 1_000,
        ..config()
    });
    s.handle_register(exec(1, "h", 2), 0).unwrap();
    let mut ts = tasks(1);
    ts[0].cores = 4;
    let job = s.handle_submit(JobSpec::new(ts), 0).unwrap();
    assert!(drain(&mut s).is_empty());
    assert_eq!(s.poll_timeout(), Some(1_000));
    s.handle_timeout(999);
    assert!(drain(&mut s).is_empty());
    s.handle_timeout(1_000);
    let outs = drain(&mut s);
    assert!(
        matches!(&outcomes(&outs)[..], [(j, JobOutcome::Failed(r))] if *j == job && r[0].contains("no executor"))
    );
}

#[test]
fn exclusion_per_job_then_global_with_expiry() {
    let mut s = Scheduler::new(Config {
        max_failures: 10,
        exclusion: Some(ExclusionConfig {
            task_executor_failures_max: 100,
            task_host_failures_max: 100,
            job_executor_failures_max: 2,
            job_host_failures_max: 100,
            executor_failures_max: 3,
            host_excluded_executors_max: 1,
            timeout_us: 1_000,
        }),
        ..config()
    });
    s.handle_register(exec(1, "bad", 1), 0).unwrap();
    let a = s.handle_submit(JobSpec::new(tasks(1)), 0).unwrap();
    for _ in 0..2 {
        let ls = launches(&drain(&mut s));
        assert_eq!(ls.len(), 1);
        update(&mut s, 1, ls[0].0, &ls[0].1, TaskState::Failed, b"x");
    }
    assert!(s.is_excluded(1, ExecutorId(1), Some(a)));
    assert!(!s.is_excluded(1, ExecutorId(1), None));
    assert!(launches(&drain(&mut s)).is_empty(), "excluded for job a");
    // Another job still runs there; its failure is the executor's third: global exclusion,
    // and with host_excluded_executors_max = 1 the host too.
    let b = s.handle_submit(JobSpec::new(tasks(1)), 2).unwrap();
    let ls = launches(&drain(&mut s));
    assert_eq!(ls.len(), 1);
    assert_eq!(ls[0].1.task.job(), b);
    update(&mut s, 3, ls[0].0, &ls[0].1, TaskState::Failed, b"x");
    assert!(s.is_excluded(3, ExecutorId(1), None));
    assert!(launches(&drain(&mut s)).is_empty());
    assert!(matches!(
        s.handle_register(exec(2, "bad", 1), 4),
        Err(Refusal::HostExcluded {
            until_us: 1_003,
            ..
        })
    ));
    assert_eq!(s.stats().executors_excluded, 1);
    // Expiry.
    assert_eq!(s.poll_timeout(), Some(1_003));
    s.handle_timeout(1_003);
    assert!(!s.is_excluded(1_003, ExecutorId(1), None));
    let ls = launches(&drain(&mut s));
    assert_eq!(ls.len(), 1, "job b runs again once the exclusion ends");
    assert_eq!(ls[0].1.task.job(), b);
    assert_eq!(s.handle_register(exec(2, "bad", 1), 1_004), Ok(()));
}

/// A scheduler that copies a task running over twice the median (checked every 10 us), with
/// a 4-core executor running the 4 tasks of one job: the scheduler, the job and the launches.
fn four_tasks_speculating() -> (Scheduler, JobId, Vec<(ExecutorId, TaskLaunch)>) {
    let mut s = Scheduler::new(Config {
        speculation: Some(SpeculationConfig {
            multiplier: 2.0,
            quantile: 0.5,
            min_runtime_us: 0,
            interval_us: 10,
            ..SpeculationConfig::default()
        }),
        ..config()
    });
    s.handle_register(exec(1, "h", 4), 0).unwrap();
    let job = s.handle_submit(JobSpec::new(tasks(4)), 0).unwrap();
    let ls = launches(&drain(&mut s));
    (s, job, ls)
}

#[test]
fn speculation_copies_a_straggler_and_the_first_result_wins() {
    let (mut s, job, ls) = four_tasks_speculating();
    assert_eq!(ls.len(), 4);
    let mut outs = Vec::new();
    for (e, l) in &ls[..3] {
        update(&mut s, 100, *e, l, TaskState::Finished, b"ok");
        outs.extend(drain(&mut s));
    }
    s.handle_register(exec(2, "h2", 1), 100).unwrap();
    // Median run 100 us, threshold 200 us: at 150 not yet, at 250 the 4th is a straggler.
    s.handle_timeout(150);
    assert!(launches(&drain(&mut s)).is_empty());
    s.handle_timeout(250);
    let copy = launches(&drain(&mut s));
    assert_eq!(copy.len(), 1);
    assert_eq!(copy[0].0, ExecutorId(2), "the copy runs elsewhere");
    assert_eq!(copy[0].1.task, ls[3].1.task);
    assert_eq!(copy[0].1.attempt, 1);
    assert_eq!(s.stats().speculative_launched, 1);
    // The copy wins; the original is killed; one result.
    update(
        &mut s,
        260,
        copy[0].0,
        &copy[0].1,
        TaskState::Finished,
        b"copy",
    );
    let outs2 = drain(&mut s);
    assert_eq!(kills(&outs2), vec![(ExecutorId(1), ls[3].1.task, 0)]);
    assert_eq!(
        results(&outs2),
        vec![(ls[3].1.task, Ok(Bytes::from_static(b"copy")))]
    );
    assert_eq!(outcomes(&outs2).len(), 1);
    assert_eq!(outcomes(&outs2)[0].0, job);
    // The original's late result is not reported again.
    update(&mut s, 270, ls[3].0, &ls[3].1, TaskState::Finished, b"orig");
    assert!(drain(&mut s).is_empty());
    assert_eq!(s.executor_cores(ExecutorId(1)), Some((4, 4)));
}

/// A speculative copy that fails while the original still runs (the original on a deaf
/// executor, say) leaves a straggler: it is copied again, not left for ever. The cluster
/// simulator found this (seed 19653, before lanes changed its plans); this is the direct test.
#[test]
fn a_failed_copy_beside_a_running_original_lets_the_straggler_be_copied_again() {
    let (mut s, job, ls) = four_tasks_speculating();
    assert_eq!(ls.len(), 4);
    for (e, l) in &ls[..3] {
        update(&mut s, 100, *e, l, TaskState::Finished, b"ok");
        drain(&mut s);
    }
    s.handle_register(exec(2, "h2", 1), 100).unwrap();
    s.handle_timeout(250);
    let copy = launches(&drain(&mut s));
    assert_eq!(copy.len(), 1, "the straggler is copied");
    assert_eq!((copy[0].0, copy[0].1.task), (ExecutorId(2), ls[3].1.task));
    // The copy fails; the original (attempt 0) still runs and never reports.
    update(
        &mut s,
        260,
        copy[0].0,
        &copy[0].1,
        TaskState::Failed,
        b"copy failed",
    );
    drain(&mut s);
    s.handle_register(exec(3, "h3", 1), 300).unwrap();
    let mut again = Vec::new();
    for now_us in (400..2_000).step_by(100) {
        s.handle_timeout(now_us);
        again.extend(launches(&drain(&mut s)));
        if !again.is_empty() {
            break;
        }
    }
    assert_eq!(again.len(), 1, "the straggling original is copied again");
    assert_eq!(again[0].1.task, ls[3].1.task);
    assert!(
        again[0].1.attempt >= 2,
        "a new attempt: {}",
        again[0].1.attempt
    );
    update(
        &mut s,
        2_100,
        again[0].0,
        &again[0].1,
        TaskState::Finished,
        b"second copy",
    );
    let outs = drain(&mut s);
    assert_eq!(outcomes(&outs).len(), 1);
    assert_eq!(outcomes(&outs)[0].0, job);
}

#[test]
fn speculation_is_on_by_default_with_sparks_thresholds() {
    let mut s = Scheduler::new(Config {
        exclusion: None,
        ..Config::default()
    });
    s.handle_register(exec(1, "h", 4), 0).unwrap();
    s.handle_submit(JobSpec::new(tasks(4)), 0).unwrap();
    let ls = launches(&drain(&mut s));
    assert_eq!(ls.len(), 4);
    for (e, l) in &ls[..3] {
        update(&mut s, 10_000, *e, l, TaskState::Finished, b"ok");
    }
    drain(&mut s);
    s.handle_register(exec(2, "h2", 1), 10_000).unwrap();
    // 3 of 4 succeeded (75%), median 10 ms: the threshold is max(1.5 x 10 ms, 100 ms).
    s.handle_timeout(50_000);
    assert!(launches(&drain(&mut s)).is_empty(), "under min_runtime");
    assert_eq!(s.poll_timeout(), Some(150_000), "checked every 100 ms");
    s.handle_timeout(150_000);
    let copy = launches(&drain(&mut s));
    assert_eq!(copy.len(), 1, "the 4th task is copied");
    assert_eq!(copy[0].0, ExecutorId(2));
    assert_eq!(copy[0].1.task, ls[3].1.task);
}

#[test]
fn a_new_executor_earns_its_slots_so_one_that_lies_about_its_cores_holds_few_tasks() {
    let mut s = Scheduler::new(config());
    assert_eq!(s.config().slow_start_slots, 16);
    // Claims a million slots; gets 16 tasks of 1000.
    s.handle_register(exec(1, "liar", 1_000_000), 0).unwrap();
    s.handle_submit(JobSpec::new(tasks(1000)), 0).unwrap();
    let first = launches(&drain(&mut s));
    assert_eq!(first.len(), 16);
    assert_eq!(s.executor_usable(ExecutorId(1)), Some(0));
    assert_eq!(s.pending_tasks(), 984);
    // Each success widens the window by one: a finished task is replaced by two.
    update(
        &mut s,
        10,
        first[0].0,
        &first[0].1,
        TaskState::Finished,
        b"",
    );
    assert_eq!(launches(&drain(&mut s)).len(), 2);
    // A failure frees its slot but does not widen the window.
    update(&mut s, 20, first[1].0, &first[1].1, TaskState::Failed, b"x");
    assert_eq!(launches(&drain(&mut s)).len(), 1);
    assert_eq!(
        s.executor_cores(ExecutorId(1)),
        Some((1_000_000, 1_000_000 - 17))
    );
    // An idle executor may take one task larger than its window.
    s.handle_register(exec(2, "big", 64), 30).unwrap();
    drain(&mut s);
    let mut big = tasks(2);
    for t in &mut big {
        t.cores = 40;
    }
    let mut s2 = Scheduler::new(config());
    s2.handle_register(exec(1, "h", 64), 0).unwrap();
    s2.handle_submit(JobSpec::new(big), 0).unwrap();
    let ls = launches(&drain(&mut s2));
    assert_eq!(ls.len(), 1, "one 40-core task on an idle 64-core executor");
    // Off: the whole executor at once.
    let mut s3 = Scheduler::new(Config {
        slow_start_slots: u32::MAX,
        ..config()
    });
    s3.handle_register(exec(1, "h", 100), 0).unwrap();
    s3.handle_submit(JobSpec::new(tasks(1000)), 0).unwrap();
    assert_eq!(launches(&drain(&mut s3)).len(), 100);
}

#[test]
fn an_executor_that_finishes_nothing_is_set_aside_and_its_tasks_copied_after_the_timeout() {
    let mut s = Scheduler::new(Config {
        exclusion: None,
        ..Config::default()
    });
    let timeout = s
        .config()
        .speculation
        .as_ref()
        .map(|sc| sc.timeout_us)
        .unwrap();
    assert_eq!(timeout, 30_000_000);
    // The stuck executor registers first and takes the whole (small) job: no task ever
    // succeeds, so the quantile rule never applies.
    s.handle_register(exec(1, "stuck", 8), 0).unwrap();
    let job = s.handle_submit(JobSpec::new(tasks(4)), 0).unwrap();
    let stuck = launches(&drain(&mut s));
    assert_eq!(stuck.len(), 4);
    s.handle_register(exec(2, "good", 8), 1_000).unwrap();
    assert!(drain(&mut s).is_empty());
    s.handle_timeout(timeout - 1);
    assert!(
        launches(&drain(&mut s)).is_empty(),
        "not before the timeout"
    );
    assert!(s.stalled_executors().is_empty());
    s.handle_timeout(timeout + 100_000);
    let copies = launches(&drain(&mut s));
    assert_eq!(
        copies.len(),
        4,
        "every stuck attempt is copied to the idle executor"
    );
    assert!(copies.iter().all(|(e, _)| *e == ExecutorId(2)));
    assert_eq!(s.stalled_executors(), vec![(ExecutorId(1), 4)]);
    assert_eq!(s.executor_usable(ExecutorId(1)), Some(0), "set aside");
    let mut outs = Vec::new();
    for (e, l) in &copies {
        update(&mut s, timeout + 10, *e, l, TaskState::Finished, b"ok");
        outs.extend(drain(&mut s));
    }
    assert_eq!(kills(&outs).len(), 4, "the stuck attempts are killed");
    assert_eq!(outcomes(&outs).len(), 1);
    assert_eq!(outcomes(&outs)[0].0, job);
    assert_eq!(results(&outs).len(), 4, "each task reported once");
    // New work avoids the stalled executor until it reports something.
    s.handle_submit(JobSpec::new(tasks(3)), timeout + 20)
        .unwrap();
    let ls = launches(&drain(&mut s));
    assert!(ls.iter().all(|(e, _)| *e == ExecutorId(2)));
    update(
        &mut s,
        timeout + 30,
        stuck[0].0,
        &stuck[0].1,
        TaskState::Killed,
        b"",
    );
    assert!(
        s.stalled_executors().is_empty(),
        "a final update brings it back"
    );
}

#[test]
fn a_full_cluster_of_long_tasks_gets_no_copies_from_the_timeout() {
    let mut s = Scheduler::new(Config {
        exclusion: None,
        slow_start_slots: u32::MAX,
        ..Config::default()
    });
    s.handle_register(exec(1, "a", 2), 0).unwrap();
    s.handle_register(exec(2, "b", 2), 0).unwrap();
    s.handle_submit(JobSpec::new(tasks(4)), 0).unwrap();
    assert_eq!(launches(&drain(&mut s)).len(), 4);
    s.handle_timeout(600_000_000);
    assert!(launches(&drain(&mut s)).is_empty());
    assert!(s.stalled_executors().is_empty());
}

/// Spark's "SPARK-26755 Ensure that a speculative task is submitted only once for execution"
/// reworked how speculatable tasks are dequeued; here, issue 14 item 1: only the head of the
/// straggler queue was looked at, so when the head ran on the offered executor nothing was
/// launched and the executor was set aside, although the straggler behind it could run there.
#[test]
fn a_straggler_at_the_head_of_the_queue_running_here_does_not_hide_the_next_one() {
    let mut s = Scheduler::new(Config {
        speculation: Some(SpeculationConfig {
            multiplier: 2.0,
            quantile: 0.3,
            min_runtime_us: 0,
            interval_us: 10,
            ..SpeculationConfig::default()
        }),
        ..config()
    });
    s.handle_register(exec(1, "ha", 2), 0).unwrap();
    s.handle_register(exec(2, "hb", 1), 0).unwrap();
    s.handle_submit(JobSpec::new(tasks(3)), 0).unwrap();
    let ls = launches(&drain(&mut s));
    assert_eq!(ls.len(), 3);
    let on = |e: u64| -> Vec<&TaskLaunch> {
        ls.iter()
            .filter(|(x, _)| *x == ExecutorId(e))
            .map(|(_, l)| l)
            .collect()
    };
    let (a, b) = (on(1), on(2));
    assert_eq!((a.len(), b.len()), (2, 1));
    update(&mut s, 100, ExecutorId(1), a[0], TaskState::Finished, b"ok");
    assert!(launches(&drain(&mut s)).is_empty());
    // Median 100 us, threshold 200 us: both remaining attempts are stragglers, queued in book
    // order (executor 1's first). Only executor 1 has a free core; its own straggler heads
    // the queue; the one running on executor 2 must be copied to it.
    s.handle_timeout(250);
    let copies = launches(&drain(&mut s));
    assert_eq!(copies.len(), 1);
    assert_eq!(copies[0].0, ExecutorId(1));
    assert_eq!(
        copies[0].1.task, b[0].task,
        "executor 2's straggler copied to executor 1"
    );
}

#[test]
fn same_inputs_same_outputs() {
    let run = || {
        let mut s = Scheduler::new(Config {
            seed: 42,
            ..config()
        });
        for i in 0..5 {
            s.handle_register(exec(i, "h", 3), 0).unwrap();
        }
        s.handle_submit(JobSpec::new(tasks(20)), 0).unwrap();
        drain(&mut s)
    };
    assert_eq!(run(), run());
}

#[test]
fn a_task_too_big_for_the_free_cores_does_not_hide_smaller_ones_behind_it() {
    let mut s = Scheduler::new(config());
    s.handle_register(exec(1, "h", 1), 0).unwrap();
    let mut ts = tasks(3);
    ts[0].cores = 2;
    let job = s.handle_submit(JobSpec::new(ts), 0).unwrap();
    let ls = launches(&drain(&mut s));
    assert_eq!(ls.len(), 1);
    assert_eq!(
        ls[0].1.task,
        TaskId::new(job, 1),
        "the 1-core task behind the 2-core one"
    );
    // Once a 2-core executor joins, the big task runs there.
    s.handle_register(exec(2, "h", 2), 1).unwrap();
    let ls = launches(&drain(&mut s));
    assert_eq!(ls.len(), 1);
    assert_eq!(
        (ls[0].0, ls[0].1.task),
        (ExecutorId(2), TaskId::new(job, 0))
    );
}

#[test]
fn a_starved_job_waits_while_an_executor_could_serve_it() {
    let mut s = Scheduler::new(Config {
        unschedulable_timeout_us: 1_000,
        ..config()
    });
    s.handle_register(exec(1, "h", 3), 0).unwrap();
    // Job a holds 2 of 3 cores; job b's 2-core task cannot fit in the 1 free core for now.
    let mut a = tasks(2);
    a[0].cores = 1;
    a[1].cores = 1;
    s.handle_submit(JobSpec::new(a), 0).unwrap();
    let running = launches(&drain(&mut s));
    let mut b = tasks(1);
    b[0].cores = 3;
    let jb = s.handle_submit(JobSpec::new(b), 0).unwrap();
    s.handle_timeout(5_000);
    assert!(
        outcomes(&drain(&mut s)).is_empty(),
        "executor 1 has 3 cores: b must wait"
    );
    for (e, l) in &running {
        update(&mut s, 5_001, *e, l, TaskState::Finished, b"");
    }
    let ls = launches(&drain(&mut s));
    assert_eq!(ls.len(), 1);
    assert_eq!(ls[0].1.task.job(), jb);
}

#[test]
fn fair_sharing_inside_a_pool_follows_job_weights_and_rebalances_on_completion() {
    let mut s = Scheduler::new(Config {
        sharing: Sharing::Fair,
        ..config()
    });
    let mut a = JobSpec::new(tasks(100));
    a.weight = 1;
    let mut b = JobSpec::new(tasks(100));
    b.weight = 2;
    let ja = s.handle_submit(a, 0).unwrap();
    let jb = s.handle_submit(b, 0).unwrap();
    s.handle_register(exec(1, "h", 6), 0).unwrap();
    let ls = launches(&drain(&mut s));
    let count = |ls: &[(ExecutorId, TaskLaunch)], j: JobId| {
        ls.iter().filter(|(_, l)| l.task.job() == j).count()
    };
    assert_eq!((count(&ls, ja), count(&ls, jb)), (2, 4));
    // A core freed by b goes back to b (2/1 = 2 vs 3/2 = 1.5 running per weight).
    let (e, l) = ls.iter().find(|(_, l)| l.task.job() == jb).unwrap().clone();
    update(&mut s, 1, e, &l, TaskState::Finished, b"");
    let next = launches(&drain(&mut s));
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].1.task.job(), jb);
}

fn running(s: &mut Scheduler, now: u64, e: ExecutorId, l: &TaskLaunch) {
    update(s, now, e, l, TaskState::Running, b"");
}

/// Spark's `TaskSetManager` starts speculating once `max(floor(quantile x tasks), 1)` tasks
/// succeeded (`minFinishedForSpeculation`, SPARK-37580). No TaskSetManagerSuite test pins the
/// floor on its own (its speculation tests use quantiles where floor and ceiling agree), so
/// this one does. Issue 14 item 2: Flint used the ceiling, so 10 tasks at 0.75 needed 8, not 7.
#[test]
fn speculation_starts_after_floor_of_quantile_times_tasks_successes() {
    let mut s = Scheduler::new(Config {
        slow_start_slots: u32::MAX,
        speculation: Some(SpeculationConfig {
            multiplier: 1.5,
            quantile: 0.75,
            min_runtime_us: 0,
            interval_us: 10,
            ..SpeculationConfig::default()
        }),
        ..config()
    });
    s.handle_register(exec(1, "a", 10), 0).unwrap();
    s.handle_submit(JobSpec::new(tasks(10)), 0).unwrap();
    let ls = launches(&drain(&mut s));
    assert_eq!(ls.len(), 10);
    for (e, l) in &ls[..7] {
        update(&mut s, 100, *e, l, TaskState::Finished, b"ok");
    }
    drain(&mut s);
    s.handle_register(exec(2, "b", 3), 100).unwrap();
    // 7 of 10 succeeded = floor(7.5): median 100 us, threshold 150 us.
    s.handle_timeout(1_000);
    let copies = launches(&drain(&mut s));
    assert_eq!(copies.len(), 3, "the three stragglers are copied");
    assert!(copies.iter().all(|(e, _)| *e == ExecutorId(2)));
}

/// TaskSetManagerSuite "skip unsatisfiable locality levels" and TaskSchedulerImplSuite
/// "SPARK-16106 locality levels updated if executor added to existing host": the valid
/// levels come from the executors registered now, so a job whose preferred executor is not
/// there does not wait for it, and the executor level comes back when it joins. Issue 14
/// item 3.
#[test]
fn locality_levels_skip_preferred_executors_that_are_not_registered_and_come_back_when_one_joins() {
    let mut s = Scheduler::new(Config {
        locality_wait_executor_us: 1_000_000,
        locality_wait_host_us: 1_000_000,
        ..config()
    });
    s.handle_register(exec(1, "host1", 1), 0).unwrap(); // execA
    s.handle_register(exec(3, "host2", 1), 0).unwrap(); // execC
    let mut ts = tasks(1);
    ts[0].preferred_executors.push(ExecutorId(2)); // execB, not registered
    ts[0].preferred_hosts.push("host1".into());
    let job = s.handle_submit(JobSpec::new(ts), 0).unwrap();
    let ls = launches(&drain(&mut s));
    assert_eq!(ls.len(), 1, "no wait for an executor that is not there");
    assert_eq!(s.job_info(job).unwrap().running, 1);
    assert_eq!(ls[0].0, ExecutorId(1), "host level at once: execA on host1");
    // SPARK-16106: two tasks prefer executor2 on host0; only host0's executor0 and
    // host1's executor1 are there.
    let mut s = Scheduler::new(Config {
        locality_wait_executor_us: 1_000_000,
        locality_wait_host_us: 1_000_000,
        ..config()
    });
    s.handle_register(exec(0, "host0", 1), 0).unwrap();
    s.handle_register(exec(1, "host1", 1), 0).unwrap();
    let mut ts = tasks(3);
    for t in &mut ts {
        t.preferred_executors.push(ExecutorId(2));
        t.preferred_hosts.push("host0".into());
    }
    let j2 = s.handle_submit(JobSpec::new(ts), 0).unwrap();
    let ls = launches(&drain(&mut s));
    assert_eq!(ls.len(), 1, "only one task: locality");
    assert_eq!(ls[0].0, ExecutorId(0));
    let info = s.job_info(j2).unwrap();
    assert_eq!(
        info.valid_levels,
        vec![LocalityLevel::Host, LocalityLevel::Any]
    );
    assert_eq!(info.locality_level, LocalityLevel::Host);
    s.handle_register(exec(2, "host0", 1), 10).unwrap();
    let ls = launches(&drain(&mut s));
    assert_eq!(ls.len(), 1);
    assert_eq!(
        ls[0].0,
        ExecutorId(2),
        "process-local on the executor that joined"
    );
    // The third task still prefers executor 2: the executor level is valid again.
    let info = s.job_info(j2).unwrap();
    assert_eq!(
        info.valid_levels,
        vec![
            LocalityLevel::Executor,
            LocalityLevel::Host,
            LocalityLevel::Any
        ]
    );
}

/// TaskSchedulerImplSuite "Locality should be used for bulk offers even with delay scheduling
/// off" and "With delay scheduling off, tasks can be run at any locality level immediately".
/// Issue 14 item 4: with a wait of 0, whichever executor was offered first took the task.
#[test]
fn with_no_locality_wait_a_task_goes_to_its_free_preferred_executor_whatever_the_offer_order() {
    for order in [[1u64, 2], [2, 1]] {
        let mut s = Scheduler::new(Config {
            locality_wait_executor_us: 0,
            locality_wait_host_us: 0,
            ..config()
        });
        // Both register before the job, so one offer round sees both.
        for id in order {
            s.handle_register(exec(id, &format!("host{id}"), 1), 0)
                .unwrap();
        }
        let mut ts = tasks(1);
        ts[0].preferred_executors.push(ExecutorId(1));
        ts[0].preferred_hosts.push("host1".into());
        s.handle_submit(JobSpec::new(ts), 0).unwrap();
        let ls = launches(&drain(&mut s));
        assert_eq!(ls.len(), 1, "order {order:?}");
        assert_eq!(ls[0].0, ExecutorId(1), "order {order:?}");
    }
    // With its preferred executor busy, the task runs elsewhere at once.
    let mut s = Scheduler::new(Config {
        locality_wait_executor_us: 0,
        locality_wait_host_us: 0,
        ..config()
    });
    s.handle_register(exec(1, "host1", 1), 0).unwrap();
    s.handle_submit(JobSpec::new(tasks(1)), 0).unwrap();
    assert_eq!(launches(&drain(&mut s))[0].0, ExecutorId(1));
    s.handle_register(exec(2, "host2", 1), 0).unwrap();
    let mut ts = tasks(1);
    ts[0].preferred_executors.push(ExecutorId(1));
    s.handle_submit(JobSpec::new(ts), 0).unwrap();
    let ls = launches(&drain(&mut s));
    assert_eq!(ls.len(), 1);
    assert_eq!(ls[0].0, ExecutorId(2));
}

/// TaskSetManagerSuite "Killing speculative tasks does not count towards aborting the
/// taskset" and "don't update excludelist for shuffle-fetch failures, preemption, denied
/// commits, or killed tasks": a KILLED attempt counts neither towards `max_failures` nor for
/// exclusion. Issue 14 item 5: with `max_failures` 1 a kill failed the job.
#[test]
fn a_killed_attempt_counts_neither_as_a_failure_nor_for_exclusion() {
    let mut s = Scheduler::new(Config {
        max_failures: 1,
        exclusion: Some(ExclusionConfig {
            executor_failures_max: 1,
            ..ExclusionConfig::default()
        }),
        ..config()
    });
    s.handle_register(exec(1, "h", 1), 0).unwrap();
    let job = s.handle_submit(JobSpec::new(tasks(1)), 0).unwrap();
    let ls = launches(&drain(&mut s));
    // The executor kills it on its own (preempted, say).
    update(
        &mut s,
        1,
        ls[0].0,
        &ls[0].1,
        TaskState::Killed,
        b"preempted",
    );
    let outs = drain(&mut s);
    assert!(outcomes(&outs).is_empty(), "the job goes on");
    let again = launches(&outs);
    assert_eq!(again.len(), 1, "retried on the same executor: not excluded");
    assert_eq!((again[0].0, again[0].1.attempt), (ExecutorId(1), 1));
    assert!(!s.is_excluded(1, ExecutorId(1), Some(job)));
    assert!(!s.is_excluded(1, ExecutorId(1), None));
    let info = s.task_info(ls[0].1.task).unwrap();
    assert_eq!(info.failures, 0);
    assert_eq!(s.job_info(job).unwrap().uncounted_ends, 1);
    assert_eq!(s.stats().attempts_killed, 1);
    update(
        &mut s,
        2,
        again[0].0,
        &again[0].1,
        TaskState::Finished,
        b"ok",
    );
    assert!(matches!(
        &outcomes(&drain(&mut s))[..],
        [(_, JobOutcome::Succeeded(_))]
    ));
}

/// TaskSetManagerSuite "executors should be excluded after task failure, in spite of locality
/// preferences" (Spark's `task.maxTaskAttemptsPerExecutor` = 1): a task that failed on an
/// executor is not retried there while another can run it. Issue 14 item 6.
#[test]
fn a_task_that_failed_on_an_executor_avoids_it() {
    let mut s = Scheduler::new(Config {
        exclusion: Some(ExclusionConfig::default()),
        ..config()
    });
    s.handle_register(exec(1, "h1", 1), 0).unwrap();
    s.handle_register(exec(2, "h2", 1), 0).unwrap();
    s.handle_submit(JobSpec::new(tasks(2)), 0).unwrap();
    let ls = launches(&drain(&mut s));
    let on = |e: u64| {
        ls.iter()
            .find(|(x, _)| *x == ExecutorId(e))
            .unwrap()
            .1
            .clone()
    };
    let (a, b) = (on(1), on(2));
    update(&mut s, 1, ExecutorId(1), &a, TaskState::Failed, b"boom");
    assert!(
        launches(&drain(&mut s)).is_empty(),
        "executor 1 is free but the task avoids it"
    );
    assert_eq!(
        s.task_info(a.task).unwrap().excluded_executors,
        vec![ExecutorId(1)]
    );
    update(&mut s, 2, ExecutorId(2), &b, TaskState::Finished, b"ok");
    let ls = launches(&drain(&mut s));
    assert_eq!(ls.len(), 1);
    assert_eq!(
        (ls[0].0, ls[0].1.task, ls[0].1.attempt),
        (ExecutorId(2), a.task, 1)
    );
}

/// TaskSchedulerImplSuite "abort stage if executor loss results in unschedulability from
/// previously failed tasks": once the only executor left is one the task failed on, the job
/// fails (after `unschedulable_timeout_us` without a launch, which Spark also waits when it
/// may get new executors) instead of hanging. Issue 14 item 6.
#[test]
fn a_job_fails_when_executor_loss_leaves_a_task_nowhere_to_run() {
    let mut s = Scheduler::new(Config {
        exclusion: Some(ExclusionConfig::default()),
        unschedulable_timeout_us: 1_000,
        ..config()
    });
    s.handle_register(exec(0, "host0", 1), 0).unwrap();
    s.handle_register(exec(1, "host1", 1), 0).unwrap();
    let job = s.handle_submit(JobSpec::new(tasks(2)), 0).unwrap();
    let ls = launches(&drain(&mut s));
    let failed = ls
        .iter()
        .find(|(e, _)| *e == ExecutorId(0))
        .unwrap()
        .1
        .clone();
    update(
        &mut s,
        1,
        ExecutorId(0),
        &failed,
        TaskState::Failed,
        b"boom",
    );
    assert!(
        outcomes(&drain(&mut s)).is_empty(),
        "it could still run on executor 1"
    );
    // Executor 1 goes; its task is retried on executor 0, the failed one cannot be.
    s.handle_remove(ExecutorId(1), RemovalReason::Lost("oops".into()), 2);
    let next = launches(&drain(&mut s));
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].0, ExecutorId(0));
    assert_ne!(next[0].1.task, failed.task);
    assert_eq!(next[0].1.attempt, 1);
    s.handle_timeout(500);
    assert!(
        outcomes(&drain(&mut s)).is_empty(),
        "not before the timeout"
    );
    s.handle_timeout(1_002);
    let outs = drain(&mut s);
    match &outcomes(&outs)[..] {
        [(j, JobOutcome::Failed(r))] => {
            assert_eq!(*j, job);
            assert!(r[0].contains("cannot run anywhere"), "{r:?}");
            assert!(r.iter().any(|r| r.contains("boom")), "{r:?}");
        }
        other => panic!("{other:?}"),
    }
}

/// TaskSchedulerImplSuite "don't abort if there is an executor available, though it hasn't
/// had scheduled tasks yet" (SPARK-15865 with SPARK-16106): tasks that failed on the only
/// executor they ran on still have another one, kept away only by locality. Issue 14 item 6.
#[test]
fn no_abort_while_an_executor_that_ran_nothing_yet_can_take_the_failed_tasks() {
    let mut s = Scheduler::new(Config {
        exclusion: Some(ExclusionConfig::default()),
        unschedulable_timeout_us: 1_000,
        locality_wait_executor_us: 5_000,
        locality_wait_host_us: 5_000,
        slow_start_slots: u32::MAX,
        ..config()
    });
    s.handle_register(exec(0, "host0", 4), 0).unwrap();
    s.handle_register(exec(1, "host1", 4), 0).unwrap();
    let mut ts = tasks(2);
    for t in &mut ts {
        t.preferred_hosts.push("host0".into());
    }
    let job = s.handle_submit(JobSpec::new(ts), 0).unwrap();
    let ls = launches(&drain(&mut s));
    assert_eq!(ls.len(), 2);
    assert!(ls.iter().all(|(e, _)| *e == ExecutorId(0)));
    for (e, l) in &ls {
        update(&mut s, 1, *e, l, TaskState::Failed, b"bad executor");
    }
    assert!(
        launches(&drain(&mut s)).is_empty(),
        "locality keeps executor 1 out for now"
    );
    s.handle_timeout(2_000);
    assert!(
        outcomes(&drain(&mut s)).is_empty(),
        "executor 1 can run them: no abort"
    );
    s.handle_timeout(10_000);
    let ls = launches(&drain(&mut s));
    assert_eq!(ls.len(), 2);
    assert!(ls.iter().all(|(e, _)| *e == ExecutorId(1)));
    assert!(s.job_info(job).is_some());
}

/// TaskSchedulerImplSuite "SPARK-39955: executor lost could fail task set if task is
/// running" / "... should not fail task set if task is launching", and issue 14 item 7: a
/// task that crashes every executor it runs on. Its executors' connections close first (lost:
/// not counted); the lifecycle handler's exit reason (caused by the app) arrives later and is
/// charged then, so the job fails after `max_failures` crashes instead of looping.
#[test]
fn a_poison_task_fails_its_job_once_late_exit_reasons_are_charged() {
    let mut s = Scheduler::new(Config {
        max_failures: 2,
        ..config()
    });
    s.handle_register(exec(1, "h1", 1), 0).unwrap();
    s.handle_register(exec(2, "h2", 1), 0).unwrap();
    let mut spec = JobSpec::new(tasks(1));
    spec.max_failures = None;
    let job = s.handle_submit(spec, 0).unwrap();
    let crash = RemovalReason::Exited {
        code: 134,
        caused_by_app: true,
    };
    // Crash 1: executor 1 (reported running) closes, is retried on executor 2; the reason
    // comes after.
    let ls = launches(&drain(&mut s));
    assert_eq!(ls[0].0, ExecutorId(1));
    running(&mut s, 1, ExecutorId(1), &ls[0].1);
    assert!(s.handle_remove(ExecutorId(1), RemovalReason::Lost("closed".into()), 2));
    let retry = launches(&drain(&mut s));
    assert_eq!((retry[0].0, retry[0].1.attempt), (ExecutorId(2), 1));
    assert_eq!(
        s.task_info(ls[0].1.task).unwrap().failures,
        0,
        "lost: not counted yet"
    );
    assert!(
        !s.handle_remove(ExecutorId(1), crash.clone(), 3),
        "already gone"
    );
    assert_eq!(
        s.task_info(ls[0].1.task).unwrap().failures,
        1,
        "charged late"
    );
    assert!(outcomes(&drain(&mut s)).is_empty());
    // Crash 2 on executor 2: the second charge reaches max_failures = 2.
    running(&mut s, 4, ExecutorId(2), &retry[0].1);
    assert!(s.handle_remove(ExecutorId(2), RemovalReason::Lost("closed".into()), 5));
    drain(&mut s);
    assert!(!s.handle_remove(ExecutorId(2), crash.clone(), 6));
    assert!(
        !s.handle_remove(ExecutorId(2), crash.clone(), 7),
        "charged once"
    );
    let outs = drain(&mut s);
    assert_eq!(s.stats().late_failures, 2);
    match &outcomes(&outs)[..] {
        [(j, JobOutcome::Failed(r))] => {
            assert_eq!(*j, job);
            assert!(r[0].contains("failed 2 times"), "{r:?}");
            assert!(r.iter().any(|r| r.contains("code 134")), "{r:?}");
        }
        other => panic!("{other:?}"),
    }
    // SPARK-39955: only the attempt the executor reported running counts when it exits.
    let mut s = Scheduler::new(Config {
        max_failures: 2,
        slow_start_slots: u32::MAX,
        ..config()
    });
    s.handle_register(exec(1, "h1", 2), 0).unwrap();
    s.handle_submit(JobSpec::new(tasks(2)), 0).unwrap();
    let ls = launches(&drain(&mut s));
    running(&mut s, 1, ls[0].0, &ls[0].1);
    assert!(s.handle_remove(ExecutorId(1), crash, 2));
    assert_eq!(
        s.task_info(ls[0].1.task).unwrap().failures,
        1,
        "was running"
    );
    assert_eq!(
        s.task_info(ls[1].1.task).unwrap().failures,
        0,
        "was launching"
    );
}

/// PoolSuite "Fair Scheduler Test" (pools "1" and "2" with minShare 2 and 3 from
/// fairscheduler.xml): a pool under its minimum share goes first, by running over min share.
/// Issue 14 item 8.
#[test]
fn fair_pools_get_their_min_share_first() {
    let pool = |name: &str, min_share: u32| PoolConfig {
        min_share,
        ..PoolConfig::new(name)
    };
    let mut s = Scheduler::new(Config {
        sharing: Sharing::Fair,
        pools: vec![pool("1", 2), pool("2", 3)],
        ..config()
    });
    let mut a = JobSpec::new(tasks(10));
    a.pool = "1".into();
    let mut b = JobSpec::new(tasks(10));
    b.pool = "2".into();
    let ja = s.handle_submit(a, 0).unwrap();
    let jb = s.handle_submit(b, 0).unwrap();
    s.handle_register(exec(1, "h", 5), 0).unwrap();
    let ls = launches(&drain(&mut s));
    let count = |j: JobId| ls.iter().filter(|(_, l)| l.task.job() == j).count();
    assert_eq!((count(ja), count(jb)), (2, 3), "each pool at its min share");
    assert_eq!(s.job_info(ja).unwrap().pool, "1");
}

/// PoolSuite "Fair Scheduler Test" reads pools whose mode is FIFO (Spark's `<schedulingMode>`):
/// inside a FIFO pool the first job takes what the pool gets; inside a FAIR pool jobs share.
/// Issue 14 item 8.
#[test]
fn a_fifo_pool_runs_its_jobs_in_order_a_fair_one_shares() {
    for (mode, expected) in [(Sharing::Fifo, (4, 0)), (Sharing::Fair, (2, 2))] {
        let mut s = Scheduler::new(Config {
            sharing: Sharing::Fair,
            pools: vec![PoolConfig {
                mode,
                ..PoolConfig::new("q")
            }],
            ..config()
        });
        let mut a = JobSpec::new(tasks(10));
        a.pool = "q".into();
        let mut b = JobSpec::new(tasks(10));
        b.pool = "q".into();
        let ja = s.handle_submit(a, 0).unwrap();
        let jb = s.handle_submit(b, 0).unwrap();
        s.handle_register(exec(1, "h", 4), 0).unwrap();
        let ls = launches(&drain(&mut s));
        let count = |j: JobId| ls.iter().filter(|(_, l)| l.task.job() == j).count();
        assert_eq!((count(ja), count(jb)), expected, "{mode:?}");
    }
}

/// Issue 14 item 9: a job's own `max_failures`, speculation and exclusion settings override
/// the scheduler's (Spark has them per application only; `Job` reaches these fields).
#[test]
fn per_job_settings_override_the_schedulers() {
    let mut s = Scheduler::new(Config {
        max_failures: 4,
        exclusion: Some(ExclusionConfig::default()),
        speculation: Some(SpeculationConfig {
            multiplier: 1.0,
            quantile: 0.5,
            min_runtime_us: 0,
            interval_us: 10,
            ..SpeculationConfig::default()
        }),
        ..config()
    });
    s.handle_register(exec(1, "h", 1), 0).unwrap();
    // max_failures 1 and exclusion off: fails at the first failure.
    let mut spec = JobSpec::new(tasks(1));
    spec.max_failures = Some(1);
    spec.exclusion = JobSetting::Off;
    spec.speculation = JobSetting::Off;
    let job = s.handle_submit(spec, 0).unwrap();
    let info = s.job_info(job).unwrap();
    assert_eq!((info.max_failures, info.speculation), (1, false));
    let ls = launches(&drain(&mut s));
    update(&mut s, 1, ls[0].0, &ls[0].1, TaskState::Failed, b"x");
    assert!(matches!(&outcomes(&drain(&mut s))[..], [(j, JobOutcome::Failed(_))] if *j == job));
    assert!(
        !s.is_excluded(1, ExecutorId(1), None),
        "its failure excluded nothing"
    );
    // Exclusion off for the job: retried on the executor it failed on.
    let mut spec = JobSpec::new(tasks(1));
    spec.exclusion = JobSetting::Off;
    s.handle_submit(spec, 2).unwrap();
    let ls = launches(&drain(&mut s));
    update(&mut s, 3, ls[0].0, &ls[0].1, TaskState::Failed, b"x");
    let again = launches(&drain(&mut s));
    assert_eq!((again[0].0, again[0].1.attempt), (ExecutorId(1), 1));
    // Speculation on for one job while the scheduler has it off.
    let mut s = Scheduler::new(config());
    s.handle_register(exec(1, "h", 2), 0).unwrap();
    let mut spec = JobSpec::new(tasks(2));
    spec.speculation = JobSetting::custom(SpeculationConfig {
        multiplier: 1.0,
        quantile: 0.5,
        min_runtime_us: 0,
        interval_us: 10,
        ..SpeculationConfig::default()
    });
    let job = s.handle_submit(spec, 0).unwrap();
    let ls = launches(&drain(&mut s));
    update(&mut s, 100, ls[0].0, &ls[0].1, TaskState::Finished, b"ok");
    drain(&mut s);
    s.handle_register(exec(2, "h2", 1), 100).unwrap();
    s.handle_timeout(1_000);
    assert_eq!(launches(&drain(&mut s)).len(), 1, "the straggler is copied");
    assert_eq!(s.job_info(job).unwrap().speculative_launched, 1);
}

/// Issue 14 item 10: a job's locality level, per-task state, failures and running attempts,
/// and per-job counters, for tests, a UI and metrics (Spark's `TaskSetManager.taskInfos`,
/// `myLocalityLevels`, `currentLocalityIndex`).
#[test]
fn introspection_reports_levels_task_states_attempts_and_counters() {
    let mut s = Scheduler::new(Config {
        locality_wait_executor_us: 1_000,
        max_failures: 3,
        ..config()
    });
    s.handle_register(exec(1, "h1", 1), 0).unwrap();
    let mut ts = tasks(2);
    ts[0].preferred_executors.push(ExecutorId(1));
    let job = s.handle_submit(JobSpec::new(ts), 0).unwrap();
    let ls = launches(&drain(&mut s));
    assert_eq!(ls.len(), 1);
    let (e, l) = ls[0].clone();
    let info = s.job_info(job).unwrap();
    assert_eq!(info.locality_level, LocalityLevel::Executor);
    assert_eq!(
        (info.tasks, info.pending, info.running, info.launched),
        (2, 1, 1, 1)
    );
    assert_eq!(info.pool, "default");
    let t = s.task_info(l.task).unwrap();
    assert_eq!(t.status, TaskStatus::Running);
    assert_eq!(t.running.len(), 1);
    assert_eq!(t.running[0].executor, e);
    assert!(!t.running[0].reported_running, "launching");
    running(&mut s, 1, e, &l);
    assert!(s.task_info(l.task).unwrap().running[0].reported_running);
    update(&mut s, 2, e, &l, TaskState::Failed, b"x");
    drain(&mut s);
    let t = s.task_info(l.task).unwrap();
    assert_eq!(
        (t.failures, t.attempts_launched),
        (1, 2),
        "retried at once (no exclusion)"
    );
    let info = s.job_info(job).unwrap();
    assert_eq!(info.failures, 1);
    assert_eq!(
        s.task_info(TaskId::new(job, 1)).unwrap().status,
        TaskStatus::Pending
    );
    assert!(s.task_info(TaskId::new(job, 9)).is_none());
}

/// Spark's `getCompletelyExcludedTaskIfAny` looks "only when at least one executor has
/// registered": with none, a job waits (the driver warns and may give up), it is not aborted
/// as unschedulable.
#[test]
fn a_job_with_no_executor_at_all_is_not_aborted_as_unschedulable() {
    let mut s = Scheduler::new(Config {
        unschedulable_timeout_us: 1_000,
        ..config()
    });
    let job = s.handle_submit(JobSpec::new(tasks(1)), 0).unwrap();
    s.handle_timeout(10_000);
    assert!(outcomes(&drain(&mut s)).is_empty());
    assert_eq!(s.poll_timeout(), None, "no deadline in the past to spin on");
    assert!(s.starved(10_000));
    s.handle_register(exec(1, "h", 1), 10_001).unwrap();
    assert_eq!(launches(&drain(&mut s)).len(), 1);
    assert!(s.job_info(job).is_some());
}

/// "Everything bounded": a service naming a new pool per job does not grow the pool table
/// past the configured pools plus `jobs_max` (issue 14 item 8).
#[test]
fn pools_made_for_jobs_are_reused_once_idle() {
    let mut s = Scheduler::new(Config {
        sharing: Sharing::Fair,
        jobs_max: 2,
        pools: vec![PoolConfig::new("kept")],
        ..config()
    });
    s.handle_register(exec(1, "h", 1), 0).unwrap();
    for i in 0..50u64 {
        let mut spec = JobSpec::new(tasks(1));
        spec.pool = format!("pool-{i}").into();
        let job = s.handle_submit(spec, i).unwrap();
        let ls = launches(&drain(&mut s));
        assert_eq!(s.job_info(job).unwrap().pool, format!("pool-{i}"));
        update(&mut s, i, ls[0].0, &ls[0].1, TaskState::Finished, b"");
        assert_eq!(outcomes(&drain(&mut s)).len(), 1);
    }
    assert!(s.pools() <= 3, "{} pools", s.pools());
}

/// The one task a one-task job launched, from the outputs.
fn single_launch(outs: &[Output]) -> (ExecutorId, TaskLaunch) {
    let mut l = launches(outs);
    assert_eq!(l.len(), 1, "one launch expected: {outs:?}");
    l.remove(0)
}

#[test]
fn fifo_order_holds_as_jobs_end_out_of_order_and_a_failed_one_is_runnable_again() {
    let mut s = Scheduler::new(config());
    s.handle_register(exec(1, "h", 1), 0).unwrap();
    let one = |priority| JobSpec {
        priority,
        ..JobSpec::new(tasks(1))
    };
    s.handle_submit_with_id(JobId(10), one(0), 0).unwrap();
    let (e, a) = single_launch(&drain(&mut s));
    assert_eq!(a.task.job(), JobId(10));
    for (id, priority) in [(20, 0), (30, 0), (15, 0), (40, 1)] {
        s.handle_submit_with_id(JobId(id), one(priority), 0)
            .unwrap();
    }
    assert!(launches(&drain(&mut s)).is_empty(), "the one core is busy");
    // A counted failure puts job 10 back among the runnable jobs, behind the higher priority.
    update(&mut s, 1, e, &a, TaskState::Failed, b"boom");
    let (e, l) = single_launch(&drain(&mut s));
    assert_eq!(l.task.job(), JobId(40), "priority first");
    update(&mut s, 2, e, &l, TaskState::Finished, b"");
    let (e, a) = single_launch(&drain(&mut s));
    assert_eq!(a.task.job(), JobId(10), "the retried job in its FIFO place");
    assert_eq!(a.attempt, 1);
    // Job 20 ends before its turn (out of order); a lower id submitted later goes first.
    assert!(s.handle_cancel(JobId(20), 3));
    update(&mut s, 4, e, &a, TaskState::Finished, b"");
    let mut order = Vec::new();
    for now in 5..8 {
        let outs = drain(&mut s);
        if launches(&outs).is_empty() {
            break;
        }
        let (e, l) = single_launch(&outs);
        order.push(l.task.job().0);
        update(&mut s, now, e, &l, TaskState::Finished, b"");
    }
    assert_eq!(order, [15, 30]);
    assert_eq!(s.active_jobs(), 0);
    assert_eq!(s.pending_tasks(), 0);
}

#[test]
fn fair_pools_reorder_as_their_running_cores_change() {
    let pools = vec![
        PoolConfig::new("a"),
        PoolConfig::new("b"),
        PoolConfig {
            min_share: 1,
            ..PoolConfig::new("z")
        },
    ];
    let mut s = Scheduler::new(Config {
        sharing: Sharing::Fair,
        pools,
        ..config()
    });
    for pool in ["a", "b", "z"] {
        let spec = JobSpec {
            pool: pool.into(),
            ..JobSpec::new(tasks(4))
        };
        s.handle_submit(spec, 0).unwrap();
    }
    let (a, b, z) = (JobId(1), JobId(2), JobId(3));
    s.handle_register(exec(1, "h", 3), 0).unwrap();
    let first: Vec<(JobId, TaskLaunch)> = launches(&drain(&mut s))
        .into_iter()
        .map(|(_, l)| (l.task.job(), l))
        .collect();
    let jobs: Vec<JobId> = first.iter().map(|(j, _)| *j).collect();
    assert_eq!(
        jobs,
        [z, a, b],
        "z under its min share, then a and b (0 each) by name"
    );
    let e = ExecutorId(1);
    // b's task ends: b runs 0 now, below a and z (1 each): its next task goes first.
    update(&mut s, 1, e, &first[2].1, TaskState::Finished, b"");
    let (_, l) = single_launch(&drain(&mut s));
    assert_eq!(l.task.job(), b);
    // z's and a's end: both run 0 now, and z, below its min share again, goes before a.
    update(&mut s, 2, e, &first[0].1, TaskState::Finished, b"");
    update(&mut s, 2, e, &first[1].1, TaskState::Finished, b"");
    let outs = drain(&mut s);
    let jobs: Vec<JobId> = launches(&outs).iter().map(|(_, l)| l.task.job()).collect();
    assert_eq!(jobs, [z, a]);
}

#[test]
fn an_executor_too_small_for_many_jobs_ahead_gets_the_task_behind_them_within_a_few_ticks() {
    for sharing in [Sharing::Fifo, Sharing::Fair] {
        too_small_for_many_jobs_ahead(sharing);
    }
}

/// 200 jobs too big for the only executor, then a small one (under FAIR in the last pool).
fn too_small_for_many_jobs_ahead(sharing: Sharing) {
    let mut s = Scheduler::new(Config {
        sharing,
        ..config()
    });
    for i in 0..200 {
        let spec = JobSpec {
            pool: format!("p{}", i % 10).into(),
            ..JobSpec::new(vec![TaskSpec {
                cores: 2,
                ..TaskSpec::new("f", Bytes::new())
            }])
        };
        s.handle_submit(spec, 0).unwrap();
    }
    let spec = JobSpec {
        pool: "zz".into(),
        ..JobSpec::new(tasks(1))
    };
    let small = s.handle_submit(spec, 0).unwrap();
    s.handle_register(exec(1, "h", 1), 0).unwrap();
    // One offer asks a bounded number of jobs (not all 200): it comes back soon to go on.
    assert!(launches(&drain(&mut s)).is_empty(), "bounded walk: not yet");
    let mut now = 0;
    let mut ticks = 0;
    let l = loop {
        let at = s
            .poll_timeout()
            .expect("a deferred executor has a deadline");
        assert!(at <= now + 1_000, "back within 1 ms, not {at}");
        now = at;
        s.handle_timeout(now);
        ticks += 1;
        let outs = drain(&mut s);
        if let Some((_, l)) = launches(&outs).pop() {
            break l;
        }
        assert!(ticks < 10, "201 jobs take 4 walks of 64 ({sharing:?})");
    };
    assert_eq!(l.task.job(), small);
    update(&mut s, now + 1, ExecutorId(1), &l, TaskState::Finished, b"");
    // Nothing fits any more: after at most one more cycle the executor stops coming back
    // (what is left is the unschedulable timeout, not a 1 ms loop).
    let mut wakeups = 0;
    while let Some(at) = s.poll_timeout().filter(|&at| at <= now + 1_000_000) {
        now = at;
        s.handle_timeout(now);
        assert!(launches(&drain(&mut s)).is_empty());
        wakeups += 1;
        assert!(
            wakeups < 10,
            "the deferrals end with the cycle ({sharing:?})"
        );
    }
    assert_eq!(s.active_jobs(), 200);
}

#[test]
fn a_job_passed_in_a_bounded_walk_that_gets_work_meanwhile_is_asked_again() {
    let mut s = Scheduler::new(config());
    let front = s.handle_submit(JobSpec::new(tasks(1)), 0).unwrap();
    for _ in 0..200 {
        let spec = JobSpec::new(vec![TaskSpec {
            cores: 2,
            ..TaskSpec::new("f", Bytes::new())
        }]);
        s.handle_submit(spec, 0).unwrap();
    }
    s.handle_register(exec(2, "h2", 1), 0).unwrap();
    let (_, first) = single_launch(&drain(&mut s));
    assert_eq!(first.task.job(), front);
    // Executor 1 walks past the front job (nothing to launch then) into the jobs too big.
    s.handle_register(exec(1, "h1", 1), 0).unwrap();
    assert!(launches(&drain(&mut s)).is_empty());
    // The front job's task comes back; executor 1 is mid-walk behind it.
    s.handle_remove(ExecutorId(2), RemovalReason::Lost("gone".into()), 1);
    let mut now = 1;
    let mut outs = drain(&mut s);
    for _ in 0..10 {
        if !launches(&outs).is_empty() {
            break;
        }
        now = s
            .poll_timeout()
            .expect("executor 1 comes back to finish its walk");
        s.handle_timeout(now);
        outs = drain(&mut s);
    }
    let (e, l) = single_launch(&outs);
    assert_eq!((e, l.task), (ExecutorId(1), first.task));
    assert!(now <= 1 + 5_000, "within a few ms, not {now}");
}

/// A one-task job at `now` whose task prefers `executor`.
fn preferring(s: &mut Scheduler, now: u64, executor: u64) -> JobId {
    let mut ts = tasks(1);
    ts[0].preferred_executors.push(ExecutorId(executor));
    s.handle_submit(JobSpec::new(ts), now).unwrap()
}

#[test]
fn poll_timeout_follows_the_earliest_locality_wait_as_jobs_come_and_go() {
    let mut s = Scheduler::new(Config {
        locality_wait_executor_us: 100,
        locality_wait_host_us: 50,
        unschedulable_timeout_us: 1_000_000,
        ..config()
    });
    s.handle_register(exec(1, "h1", 1), 0).unwrap();
    s.handle_submit(JobSpec::new(tasks(1)), 0).unwrap();
    assert_eq!(launches(&drain(&mut s)).len(), 1, "executor 1 is busy");
    let a = preferring(&mut s, 10, 1);
    let b = preferring(&mut s, 20, 1);
    assert_eq!(s.poll_timeout(), Some(110), "a's executor wait ends first");
    assert!(s.handle_cancel(a, 30));
    assert_eq!(outcomes(&drain(&mut s)), [(a, JobOutcome::Cancelled)]);
    assert_eq!(s.poll_timeout(), Some(120), "then b's, once a is gone");
    s.handle_timeout(119);
    assert_eq!(
        s.job_info(b).unwrap().locality_level,
        LocalityLevel::Executor
    );
    s.handle_timeout(120);
    assert_eq!(s.job_info(b).unwrap().locality_level, LocalityLevel::Host);
    assert_eq!(s.poll_timeout(), Some(170), "the host wait runs from 120");
    s.handle_timeout(170);
    assert_eq!(s.job_info(b).unwrap().locality_level, LocalityLevel::Any);
    assert_eq!(
        s.poll_timeout(),
        None,
        "b fits executor 1 and nothing is excluded: it has no unschedulable clock"
    );
    assert!(drain(&mut s).is_empty(), "still no free core");
}

#[test]
fn a_locality_level_left_with_nothing_to_wait_for_widens_at_the_next_tick() {
    let mut s = Scheduler::new(Config {
        locality_wait_executor_us: 1_000,
        locality_wait_host_us: 1_000,
        ..config()
    });
    s.handle_register(exec(1, "h1", 1), 0).unwrap();
    s.handle_register(exec(2, "h2", 1), 0).unwrap();
    s.handle_submit(JobSpec::new(tasks(2)), 0).unwrap();
    assert_eq!(launches(&drain(&mut s)).len(), 2, "both executors are busy");
    let job = preferring(&mut s, 0, 2);
    // A job whose slot is reused after it was listed for the tick must not confuse it.
    let gone = preferring(&mut s, 0, 2);
    assert_eq!(
        s.job_info(job).unwrap().locality_level,
        LocalityLevel::Executor
    );
    s.handle_remove(ExecutorId(2), RemovalReason::Lost("gone".into()), 5);
    assert!(s.handle_cancel(gone, 5));
    assert_eq!(outcomes(&drain(&mut s)), [(gone, JobOutcome::Cancelled)]);
    let other = s.handle_submit(JobSpec::new(tasks(1)), 5).unwrap();
    assert_eq!(
        s.job_info(job).unwrap().locality_level,
        LocalityLevel::Executor,
        "until the next tick"
    );
    s.handle_timeout(6);
    assert_eq!(
        s.job_info(job).unwrap().locality_level,
        LocalityLevel::Any,
        "no executor or host left to wait for: both levels skipped long before the waits"
    );
    assert_eq!(
        s.job_info(other).unwrap().locality_level,
        LocalityLevel::Any
    );
    assert!(drain(&mut s)
        .iter()
        .all(|o| !matches!(o, Output::Event(Event::JobOutcome { .. }))));
}

#[test]
fn unschedulable_jobs_due_together_fail_in_fifo_order_and_a_starved_one_waits_without_a_clock() {
    let mut s = Scheduler::new(Config {
        unschedulable_timeout_us: 1_000,
        ..config()
    });
    s.handle_register(exec(1, "h", 2), 0).unwrap();
    let big = |s: &mut Scheduler, now: u64, priority: i32| {
        let mut ts = tasks(1);
        ts[0].cores = 4;
        s.handle_submit(
            JobSpec {
                priority,
                ..JobSpec::new(ts)
            },
            now,
        )
        .unwrap()
    };
    // Executor 1 is kept busy, so `starved` waits for cores it could have.
    s.handle_submit(JobSpec::new(tasks(2)), 0).unwrap();
    assert_eq!(launches(&drain(&mut s)).len(), 2);
    let low = big(&mut s, 0, 0);
    let starved = s.handle_submit(JobSpec::new(tasks(1)), 0).unwrap();
    let high = big(&mut s, 0, 5);
    let later = big(&mut s, 500, 0);
    assert_eq!(s.poll_timeout(), Some(1_000));
    s.handle_timeout(999);
    assert!(outcomes(&drain(&mut s)).is_empty());
    s.handle_timeout(1_000);
    let failed: Vec<JobId> = outcomes(&drain(&mut s))
        .into_iter()
        .map(|(j, _)| j)
        .collect();
    assert_eq!(failed, [high, low], "priority first, then submission");
    assert!(s.job_info(starved).is_some(), "it could run on executor 1");
    assert_eq!(
        s.poll_timeout(),
        Some(1_500),
        "later's clock, then starved's"
    );
    s.handle_timeout(1_500);
    let failed: Vec<JobId> = outcomes(&drain(&mut s))
        .into_iter()
        .map(|(j, _)| j)
        .collect();
    assert_eq!(failed, [later]);
    assert_eq!(
        s.poll_timeout(),
        None,
        "starved fits executor 1 and nothing is excluded: nothing may leave it stuck"
    );
    assert!(s.job_info(starved).is_some());
}

#[test]
fn valid_levels_follow_the_executors_and_hosts_a_job_prefers_as_they_come_and_go() {
    let mut s = Scheduler::new(config());
    s.handle_register(exec(2, "h2", 1), 0).unwrap();
    s.handle_register(exec(3, "h2", 1), 0).unwrap();
    // Too big to launch anywhere, so it stays queued; it prefers executor 2, hence host h2.
    let mut ts = tasks(1);
    ts[0].cores = 8;
    ts[0].preferred_executors.push(ExecutorId(2));
    let job = s.handle_submit(JobSpec::new(ts), 0).unwrap();
    // Another job's preferences must not be touched by these executors.
    let other = preferring(&mut s, 0, 9);
    let levels = |s: &Scheduler, j| s.job_info(j).unwrap().valid_levels;
    use LocalityLevel::{Any, Executor, Host};
    assert_eq!(levels(&s, job), [Executor, Host, Any]);
    s.handle_remove(ExecutorId(2), RemovalReason::Lost("gone".into()), 1);
    assert_eq!(levels(&s, job), [Host, Any], "h2 still has executor 3");
    s.handle_remove(ExecutorId(3), RemovalReason::Lost("gone".into()), 2);
    assert_eq!(levels(&s, job), [Any], "h2 has no executor left");
    s.handle_register(exec(4, "h2", 1), 3).unwrap();
    assert_eq!(levels(&s, job), [Host, Any], "h2 is back");
    s.handle_register(exec(2, "h1", 1), 4).unwrap();
    assert_eq!(levels(&s, job), [Executor, Host, Any], "executor 2 is back");
    assert_eq!(levels(&s, other), [Any], "executor 9 never came");
}

#[test]
fn a_job_that_keeps_launching_is_checked_once_per_timeout_and_never_failed() {
    // Launches move the unschedulable clock without re-filing it: the filed time comes due
    // early, once, and the tick files the job's real progress. The job's clock runs once a
    // failure gave it exclusion records (which may leave a job stuck).
    let mut s = Scheduler::new(Config {
        unschedulable_timeout_us: 1_000,
        exclusion: Some(lenient_exclusion(100)),
        ..config()
    });
    s.handle_register(exec(1, "h", 1), 0).unwrap();
    let job = s.handle_submit(JobSpec::new(tasks(3)), 0).unwrap();
    let first = launches(&drain(&mut s));
    assert_eq!(first.len(), 1);
    assert_eq!(s.poll_timeout(), None, "nothing may leave it stuck yet");
    update(
        &mut s,
        100,
        ExecutorId(1),
        &first[0].1,
        TaskState::Failed,
        b"x",
    );
    let again = launches(&drain(&mut s));
    assert_eq!(again.len(), 1, "the failed task again, at 100");
    assert_eq!(s.poll_timeout(), Some(1_100), "its clock runs from 100");
    update(
        &mut s,
        800,
        ExecutorId(1),
        &again[0].1,
        TaskState::Finished,
        b"",
    );
    assert_eq!(launches(&drain(&mut s)).len(), 1, "the second task at 800");
    assert_eq!(
        s.poll_timeout(),
        Some(1_100),
        "filed at the failure: due early"
    );
    s.handle_timeout(1_100);
    assert!(outcomes(&drain(&mut s)).is_empty(), "it progressed at 800");
    assert_eq!(
        s.poll_timeout(),
        Some(1_800),
        "re-filed at its real progress"
    );
    assert!(s.job_info(job).is_some());
}

/// Exclusion that never excludes for a task or a job (limits of 100 failures), and excludes an
/// executor globally after `executor_failures_max` failures there.
fn lenient_exclusion(executor_failures_max: u32) -> ExclusionConfig {
    ExclusionConfig {
        task_executor_failures_max: 100,
        task_host_failures_max: 100,
        job_executor_failures_max: 100,
        job_host_failures_max: 100,
        executor_failures_max,
        host_excluded_executors_max: 100,
        timeout_us: 1_000_000,
    }
}

#[test]
fn a_job_gets_an_unschedulable_clock_when_something_may_leave_it_stuck_and_a_whole_timeout() {
    let mut s = Scheduler::new(Config {
        unschedulable_timeout_us: 1_000,
        exclusion: Some(lenient_exclusion(1)),
        ..config()
    });
    s.handle_register(exec(1, "h1", 1), 0).unwrap();
    s.handle_register(exec(2, "h2", 4), 0).unwrap();
    let busy = s.handle_submit(JobSpec::new(tasks(5)), 0).unwrap();
    let first = launches(&drain(&mut s));
    assert_eq!(first.len(), 5, "both executors full");
    let small = s.handle_submit(JobSpec::new(tasks(1)), 0).unwrap();
    let mut ts = tasks(1);
    ts[0].cores = 4;
    let big = s.handle_submit(JobSpec::new(ts), 0).unwrap();
    assert_eq!(
        s.poll_timeout(),
        None,
        "both fit an executor; nothing is excluded"
    );
    // The only executor big fits goes: its clock starts then, not at its submission.
    s.handle_remove(ExecutorId(2), RemovalReason::Lost("gone".into()), 5_000);
    assert!(outcomes(&drain(&mut s)).is_empty());
    assert_eq!(s.poll_timeout(), Some(6_000), "big's clock, from 5,000");
    s.handle_timeout(5_999);
    assert!(outcomes(&drain(&mut s)).is_empty());
    s.handle_timeout(6_000);
    assert!(matches!(
        &outcomes(&drain(&mut s))[..],
        [(j, JobOutcome::Failed(r))] if *j == big && r[0].contains("no executor")
    ));
    assert!(s.job_info(small).is_some(), "small fits executor 1");
    // Executor 1 is excluded everywhere after one failure: every job with tasks queued may
    // be stuck now, and gets a whole timeout from then.
    let (_, on_1) = first
        .iter()
        .find(|(e, _)| *e == ExecutorId(1))
        .expect("a task on executor 1");
    update(&mut s, 6_100, ExecutorId(1), on_1, TaskState::Failed, b"x");
    assert!(s.is_excluded(6_100, ExecutorId(1), None));
    assert!(outcomes(&drain(&mut s)).is_empty());
    assert_eq!(
        s.poll_timeout(),
        Some(7_100),
        "small's and busy's clocks, from 6,100"
    );
    s.handle_timeout(7_099);
    assert!(outcomes(&drain(&mut s)).is_empty());
    s.handle_timeout(7_100);
    let mut failed: Vec<JobId> = outcomes(&drain(&mut s))
        .into_iter()
        .map(|(j, _)| j)
        .collect();
    failed.sort();
    assert_eq!(failed, [busy, small], "no executor they may use");
}

#[test]
fn a_batch_of_updates_fills_the_slots_it_frees_in_one_launch_per_executor() {
    let mut s = Scheduler::new(config());
    s.handle_register(exec(1, "h", 4), 0).unwrap();
    s.handle_submit(JobSpec::new(tasks(8)), 0).unwrap();
    let first = launches(&drain(&mut s));
    assert_eq!(first.len(), 4);
    s.handle_statuses(finished(&first), 10);
    let outs = drain(&mut s);
    let batches: Vec<usize> = outs
        .iter()
        .filter_map(|o| match o {
            Output::Launch { tasks, .. } => Some(tasks.len()),
            _ => None,
        })
        .collect();
    assert_eq!(batches, [4], "one Launch with the four freed slots");
    assert_eq!(results(&outs).len(), 4);
}

#[test]
fn a_draining_executor_gets_no_new_work_and_its_running_attempts_finish() {
    let mut s = Scheduler::new(config());
    s.handle_register(exec(1, "h", 2), 0).unwrap();
    s.handle_register(exec(2, "h", 2), 0).unwrap();
    let job = s.handle_submit(JobSpec::new(tasks(6)), 0).unwrap();
    let ls = launches(&drain(&mut s));
    assert_eq!(ls.len(), 4);
    assert!(s.handle_drain(ExecutorId(1)));
    assert_eq!(s.executor_draining(ExecutorId(1)), Some(true));
    assert_eq!(s.executor_draining(ExecutorId(2)), Some(false));
    assert!(!s.handle_drain(ExecutorId(9)), "not registered");
    // Its attempts finish normally; the cores they free are not offered again.
    let mut on_two = 0;
    for (i, (e, l)) in ls.iter().enumerate() {
        update(&mut s, 1 + i as u64, *e, l, TaskState::Finished, b"r");
        for (at, _) in launches(&drain(&mut s)) {
            assert_eq!(
                at,
                ExecutorId(2),
                "nothing launched on the draining executor"
            );
            on_two += 1;
        }
    }
    assert_eq!(on_two, 2, "the two left ran on executor 2");
    assert_eq!(s.executor_cores(ExecutorId(1)), Some((2, 2)), "drained");
    assert_eq!(s.job_pending_tasks(job), Some(0));
    assert_eq!(s.stats().attempts_failed, 0);
}

/// One offer round over several free executors: the first job in FIFO order gives them its
/// tasks in turn (one each, round-robin, as Spark's offers do), and when it runs dry the round
/// goes on to the next job. The jobs' listing and timers are settled by the end of the round:
/// `poll_timeout` (which checks the timers against a scan of the jobs in debug builds) agrees,
/// and a job submitted next gets the next free slot.
#[test]
fn a_round_over_free_executors_takes_the_first_jobs_tasks_in_turn_then_the_next_jobs() {
    let mut s = Scheduler::new(config());
    for i in 1..=3 {
        s.handle_register(exec(i, "h", 2), 0).unwrap();
    }
    // Every slot busy, then two jobs queue behind.
    s.handle_submit(JobSpec::new(tasks(6)), 0).unwrap();
    let busy = launches(&drain(&mut s));
    assert_eq!(busy.len(), 6);
    let a = s.handle_submit(JobSpec::new(tasks(2)), 0).unwrap();
    let b = s.handle_submit(JobSpec::new(tasks(4)), 0).unwrap();
    assert!(launches(&drain(&mut s)).is_empty(), "no free slot");
    // All six end in one batch: the three executors are offered in one round.
    s.handle_statuses(finished(&busy), 10);
    let round = launches(&drain(&mut s));
    assert_eq!(round.len(), 6, "every freed slot filled");
    let on = |job: JobId| -> Vec<ExecutorId> {
        let mut v: Vec<_> = (round.iter())
            .filter(|(_, l)| l.task.job() == job)
            .map(|(e, _)| *e)
            .collect();
        v.sort();
        v
    };
    let on_a = on(a);
    assert_eq!(on_a.len(), 2, "the first job's tasks all went");
    assert_ne!(on_a[0], on_a[1], "one each, in turn: {on_a:?}");
    assert_eq!(on(b).len(), 4, "the next job took the rest");
    for i in 1..=3 {
        assert_eq!(
            s.executor_cores(ExecutorId(i)),
            Some((2, 0)),
            "executor {i} full"
        );
    }
    assert_eq!(
        (s.job_pending_tasks(a), s.job_pending_tasks(b)),
        (Some(0), Some(0))
    );
    // No job has tasks queued: no unschedulable clock is left filed (checked in debug builds).
    let _ = s.poll_timeout();
    let c = s.handle_submit(JobSpec::new(tasks(1)), 20).unwrap();
    let (e, l) = round[0].clone();
    update(&mut s, 30, e, &l, TaskState::Finished, b"");
    let next = launches(&drain(&mut s));
    assert_eq!(next.len(), 1);
    assert_eq!((next[0].0, next[0].1.task.job()), (e, c));
}
