use super::*;

#[test]
fn histogram_buckets_end_at_inf() {
    let mut h = Histogram::default();
    h.observe(5);
    h.observe(10);
    h.observe(11);
    h.observe(u64::MAX / 4);
    let c = h.buckets_seconds();
    assert_eq!(c[0], (10e-6, 2));
    assert_eq!(c[1], (25e-6, 1));
    assert_eq!(*c.last().unwrap(), (f64::MAX, 1));
    assert_eq!(h.count, 4);
}

fn launch(task: TaskId, attempt: u32, speculative: bool) -> TaskLaunch {
    TaskLaunch {
        task,
        attempt,
        function: std::sync::Arc::from("f"),
        payload: bytes::Bytes::new(),
        cores: 1,
        speculative,
    }
}

#[test]
fn jobs_keep_their_sampled_times_copies_and_bars() {
    let mut t = LoopTelemetry::new(Instant::now());
    let job = JobId(16);
    t.job_submitted(0, job, Some(&std::sync::Arc::from("f")), 64, "pool-a");
    t.executor_registered(ExecutorId(1), "e1", "h", 2);
    // Tasks 0, 16, 32, 48 are sampled (16 + index divisible by 16).
    for index in 0..64 {
        let task = TaskId::new(job, index);
        t.launched(1_000, &launch(task, 0, false), ExecutorId(1), || index % 2);
    }
    let straggler = TaskId::new(job, 5); // not sampled: its copy is tracked anyway
    t.launched(2_000, &launch(straggler, 1, true), ExecutorId(1), || 1);
    t.kill_sent(3_000, Attempt::new(straggler, 0));
    for index in 0..64 {
        let task = TaskId::new(job, index);
        let end = 1_000 + 100 * u64::from(index);
        t.status_update(end, ExecutorId(1), task, 0, TaskState::Finished, b"");
    }
    t.take_point(10_000, &Stats::default(), 0, 1);
    let view = t.view(|_| 0, |_| None, 10_000);
    let j = &view.jobs[0];
    assert_eq!((&*j.pool, j.copies), ("pool-a", 1));
    let durations = j.task_durations.expect("sampled durations");
    assert_eq!(
        (durations.sampled, durations.min_us, durations.max_us),
        (4, 0, 4_800)
    );
    assert_eq!(j.scheduler_delays.map(|d| d.p50_us), Some(1_000));
    assert_eq!(view.timeline.len(), 5, "4 sampled attempts and the copy");
    let copy = view
        .timeline
        .iter()
        .find(|b| b.copy)
        .expect("the copy's bar");
    assert_eq!((copy.task, copy.end_us, copy.lane), (5, None, 1));
    assert_eq!(view.series.len(), 1);
    let slowest = view.series[0].round_trip.map_or(0, |s| s.max_us);
    assert!(
        (4_400..=5_300).contains(&slowest),
        "{slowest} is within 9% of 4800"
    );
    t.executor_removed(11_000, ExecutorId(1), "gone", true);
    let view = t.view(|_| 0, |_| None, 12_000);
    let copy = view
        .timeline
        .iter()
        .find(|b| b.copy)
        .expect("the copy's bar");
    assert_eq!(copy.outcome, timeline::Outcome::Lost);
}

#[test]
fn failures_are_counted_per_job_and_executor() {
    let mut t = LoopTelemetry::new(Instant::now());
    let job = JobId(7);
    t.job_submitted(0, job, Some(&std::sync::Arc::from("hash")), 2, "default");
    t.executor_registered(ExecutorId(1), "e1", "h", 2);
    let task = TaskId::new(job, 9); // sampled: 7 + 9 = 16
    t.launched(50, &launch(task, 0, false), ExecutorId(1), || 0);
    t.status_update(100, ExecutorId(1), task, 0, TaskState::Failed, b"boom");
    t.status_update(
        200,
        ExecutorId(1),
        TaskId::new(job, 1),
        0,
        TaskState::Finished,
        b"",
    );
    t.tasks_finished(ExecutorId(1), 1);
    let view = t.view(|_| 1, |_| None, 300);
    assert_eq!(view.executors[0].tasks_failed, 1);
    assert_eq!(view.executors[0].tasks_finished, 1);
    assert_eq!(view.executors[0].tasks_running, 1);
    assert_eq!(view.jobs[0].attempts_failed, 1);
    assert_eq!(view.jobs[0].failures, vec!["boom".to_owned()]);
    assert_eq!(view.failures[0].reason, "boom");
    assert_eq!(view.round_trip.count, 1);
    let outcome = JobOutcome::Failed(vec!["task 0 failed 4 times".into()]);
    t.job_over(400, job, JobEnd::of(&outcome));
    let view = t.view(|_| 0, |_| None, 500);
    assert_eq!(view.jobs[0].state, "FAILED");
    let reasons = ["boom".to_owned(), "task 0 failed 4 times".to_owned()];
    assert_eq!(
        view.jobs[0].failures, reasons,
        "the job's own reason kept after"
    );
    assert_eq!(view.jobs_over, [0, 1, 0]);
    assert_eq!(view.active_jobs, 0);
}

#[test]
fn tasks_done_are_counted_per_job_across_interleaved_runs() {
    let mut t = LoopTelemetry::new(Instant::now());
    let (a, b) = (JobId(1), JobId(2));
    let f = std::sync::Arc::from("f");
    t.job_submitted(0, a, Some(&f), 5, "default");
    t.job_submitted(0, b, Some(&f), 5, "default");
    for job in [a, a, b, a, b, b, b] {
        t.task_done(job);
    }
    let done = |t: &LoopTelemetry| {
        let view = t.view(|_| 0, |_| None, 1_000);
        let mut done: Vec<(u64, u64)> = view.jobs.iter().map(|j| (j.id, j.tasks_done)).collect();
        done.sort_unstable();
        done
    };
    assert_eq!(
        done(&t),
        [(1, 3), (2, 4)],
        "the run still pending counts too"
    );
    t.task_done(b);
    t.job_over(2_000, b, JobEnd::Succeeded);
    t.task_done(a);
    assert_eq!(done(&t), [(1, 4), (2, 5)], "an ended job keeps its count");
    // A run pending while another job ends stays its own job's, and its job's end takes it.
    let c = JobId(3);
    t.job_submitted(2_000, c, Some(&f), 1, "default");
    t.task_done(a);
    t.job_over(2_500, c, JobEnd::Cancelled);
    assert_eq!(done(&t), [(1, 5), (2, 5), (3, 0)]);
    t.job_over(3_000, a, JobEnd::Succeeded);
    assert_eq!(done(&t), [(1, 5), (2, 5), (3, 0)], "the last run counted");
}

/// A job that named no pool (`None`, most jobs: the telemetry does not compare names) shows
/// the default pool, as one that named "default" does, both sharing the one default name; a
/// named pool shows its own.
#[test]
fn a_job_without_a_pool_shows_the_default_one() {
    let mut t = LoopTelemetry::new(Instant::now());
    let f = std::sync::Arc::from("f");
    t.job_submitted_to(0, JobId(1), Some(&f), 1, None);
    t.job_submitted(0, JobId(2), Some(&f), 1, "default");
    t.job_submitted_to(0, JobId(3), Some(&f), 1, Some("batch"));
    let view = t.view(|_| 0, |_| None, 10);
    let pool = |id: u64| {
        let job = view
            .jobs
            .iter()
            .find(|j| j.id == id)
            .expect("the job's view");
        job.pool.clone()
    };
    assert_eq!(&*pool(1), "default");
    assert!(
        std::sync::Arc::ptr_eq(&pool(1), &pool(2)),
        "one default name"
    );
    assert_eq!(&*pool(3), "batch");
}

/// A one-task job's success in one call shows what its task's result and its end, told
/// apart, show: the task counted, the end and its latency, and another job's pending run
/// still its own.
#[test]
fn a_one_task_jobs_success_in_one_call_counts_as_its_result_and_end() {
    let f = std::sync::Arc::from("f");
    let (a, b) = (JobId(1), JobId(2));
    let run = |apart: bool| {
        let mut t = LoopTelemetry::new(Instant::now());
        t.job_submitted(0, a, Some(&f), 3, "default");
        t.job_submitted(0, b, Some(&f), 1, "default");
        t.task_done(a);
        t.task_done(a);
        if apart {
            t.task_done(b);
            t.job_over(700, b, JobEnd::Succeeded);
        } else {
            t.one_task_job_succeeded(700, b);
        }
        let running = t.view(|_| 0, |_| None, 800);
        // Not active: nothing counted (as `job_over` counts nothing then).
        t.one_task_job_succeeded(900, JobId(3));
        t.task_done(a);
        t.job_over(1_000, a, JobEnd::Succeeded);
        t.take_point(2_000_000, &Stats::default(), 0, 0);
        (running, t.view(|_| 0, |_| None, 2_000_000))
    };
    let summary = |view: &DriverView| {
        let jobs: Vec<_> = (view.jobs.iter())
            .map(|j| (j.id, j.state, j.tasks_done, j.duration))
            .collect();
        let latency = view.series.last().and_then(|p| p.job_latency);
        (jobs, view.jobs_over, view.active_jobs, latency)
    };
    let ((running_apart, over_apart), (running, over)) = (run(true), run(false));
    assert_eq!(summary(&running), summary(&running_apart));
    assert_eq!(summary(&over), summary(&over_apart));
    let (jobs, jobs_over, active, latency) = summary(&running);
    assert_eq!(jobs[0].0..=jobs[1].0, 1..=2);
    assert_eq!((jobs[0].2, jobs[1].1, jobs[1].2), (2, "SUCCEEDED", 1));
    assert_eq!((jobs_over, active, latency), ([1, 0, 0], 1, None));
    let (jobs, jobs_over, _, latency) = summary(&over);
    assert_eq!((jobs[0].0, jobs[0].2, jobs_over), (1, 3, [2, 0, 0]));
    let latency = latency.map(|l| (l.p50_us.abs_diff(700) < 70, l.max_us.abs_diff(1_000) < 90));
    assert_eq!(
        latency,
        Some((true, true)),
        "both latencies observed (700, 1000 us)"
    );
}

/// A buffer the log lines of a test's subscriber go to.
#[derive(Clone, Default)]
struct Lines(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("not poisoned").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// With a subscriber on, a job's lines are logged in its span: submitted, and done with its
/// outcome, whichever call ends it.
#[test]
fn a_jobs_lines_are_logged_in_its_span() {
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        let mut t = LoopTelemetry::new(Instant::now());
        let f = std::sync::Arc::from("hash");
        t.job_submitted(0, JobId(4), Some(&f), 1, "default");
        t.job_submitted(0, JobId(5), Some(&f), 1, "default");
        t.one_task_job_succeeded(2_000, JobId(4));
        t.job_over(3_000, JobId(5), JobEnd::Cancelled);
        // Until a slot the first jobs had takes a new job's record (its span made in place).
        for job in 6..RECENT_JOBS_MAX as u64 + 8 {
            t.job_submitted(4_000, JobId(job), Some(&f), 1, "default");
            t.one_task_job_succeeded(5_000, JobId(job));
        }
    });
    let text = String::from_utf8(lines.0.lock().expect("not poisoned").clone()).expect("utf-8");
    let logged: Vec<&str> = text.lines().collect();
    assert_eq!(logged.len(), 4 + 2 * (RECENT_JOBS_MAX + 2), "{text}");
    let last = RECENT_JOBS_MAX + 7;
    let span = format!("job{{job={last} function=\"hash\" tasks=1}}");
    let (submitted, done) = (logged[logged.len() - 2], logged[logged.len() - 1]);
    assert!(submitted.contains(&span) && submitted.ends_with("job submitted"));
    assert!(done.contains(&span) && done.ends_with("outcome=\"SUCCEEDED\""));
    for (line, job) in logged[..2].iter().zip([4, 5]) {
        let span = format!("job{{job={job} function=\"hash\" tasks=1}}");
        assert!(
            line.contains(&span) && line.ends_with("job submitted"),
            "{line}"
        );
    }
    let span = "job{job=4 function=\"hash\" tasks=1}";
    assert!(logged[2].contains(span), "{}", logged[2]);
    assert!(
        logged[2].ends_with("job done duration_ms=2 failed_attempts=0 outcome=\"SUCCEEDED\""),
        "{}",
        logged[2]
    );
    assert!(logged[3].contains("job{job=5"), "{}", logged[3]);
    assert!(
        logged[3].ends_with("outcome=\"CANCELLED\""),
        "{}",
        logged[3]
    );
}
