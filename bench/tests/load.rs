//! The load generators against a real loopback cluster (executors as threads): every mode ends
//! with `succeeded + failed == tasks`, warm-up tasks are not counted, and failures are counted.

use std::time::Duration;

use flint_bench::cluster::{Cluster, ClusterSpec, ExecutorSource};
use flint_bench::load::{self, Limit, LoadSpec, Mode};
use flint_net::driver::DriverConfig;

fn cluster() -> Cluster {
    let mut driver = DriverConfig::default();
    driver.scheduler.max_failures = 2;
    Cluster::start(ClusterSpec {
        executors: 2,
        cores: 1,
        source: ExecutorSource::Threads,
        driver,
        relay_first: false,
    })
    .expect("a loopback cluster starts")
}

fn spec(mode: Mode, task: &str, limit: Limit) -> LoadSpec {
    LoadSpec {
        mode,
        task: task.into(),
        payload_bytes: 16,
        limit,
        warmup: Duration::from_millis(100),
        outstanding_max: 100_000,
        jobs_max: 1000,
        progress: false,
        submitters: 1,
        beside_tasks: None,
        intervals: true,
    }
}

/// A job beside the load runs with it and is reported; the load's tasks are all accounted
/// for and the beside job's are not counted among them.
#[test]
fn a_job_beside_the_load_runs_and_is_reported_apart() {
    let cluster = cluster();
    let closed = Mode::Closed {
        in_flight: 4,
        batch: 1,
    };
    let spec = LoadSpec {
        beside_tasks: Some(2_000),
        ..spec(closed, "noop", Limit::Tasks(20_000))
    };
    let run = load::run(&cluster.driver, &spec).unwrap();
    assert_eq!((run.summary.tasks, run.summary.succeeded), (20_000, 20_000));
    assert_eq!(
        run.histogram.len(),
        20_000,
        "the beside job's tasks are not measured"
    );
    // Done (2,000 noops beside 20,000 one-task jobs, as a rule), or cancelled with the load.
    if let Some(took) = run.beside.expect("a beside job is reported") {
        assert!(took > Duration::ZERO);
        assert_eq!(
            cluster.driver.active_jobs(),
            0,
            "its end was seen with its counts"
        );
    }
}

#[test]
fn closed_open_and_failing_runs_account_for_every_task() {
    let cluster = cluster();
    let driver = &cluster.driver;

    let closed = Mode::Closed {
        in_flight: 16,
        batch: 3,
    };
    let run = load::run(driver, &spec(closed, "hash", Limit::Tasks(500))).unwrap();
    assert_eq!(run.summary.tasks, 500);
    assert_eq!(run.summary.succeeded, 500);
    assert_eq!(run.histogram.len(), 500);
    assert_ne!(run.summary.checksum, 0, "hash results are checksummed");
    assert!(!run.intervals.is_empty());
    assert_eq!(run.timeline.iter().sum::<u64>(), 500);
    let without = LoadSpec {
        intervals: false,
        ..spec(closed, "hash", Limit::Tasks(500))
    };
    let run = load::run(driver, &without).unwrap();
    assert_eq!((run.summary.tasks, run.summary.succeeded), (500, 500));
    assert_eq!(
        run.histogram.len(),
        500,
        "every latency counted all the same"
    );
    assert!(
        run.intervals.is_empty(),
        "no interval histograms unless asked"
    );
    assert_eq!(run.timeline.iter().sum::<u64>(), 500);

    let open = Mode::Open { rate_per_s: 2000.0 };
    let run = load::run(driver, &spec(open, "noop", Limit::Tasks(300))).unwrap();
    assert_eq!((run.summary.tasks, run.summary.succeeded), (300, 300));
    assert_eq!(run.offered_per_s, Some(2000.0));

    let timed = load::run(
        driver,
        &spec(open, "noop", Limit::Duration(Duration::from_millis(300))),
    )
    .unwrap();
    let tasks = timed.summary.tasks;
    assert!((500..=700).contains(&tasks), "300 ms at 2000/s: {tasks}");
    assert_eq!(timed.summary.succeeded, tasks);

    let lanes = LoadSpec {
        submitters: 3,
        ..spec(closed, "hash", Limit::Tasks(301))
    };
    let three = load::run(driver, &lanes).unwrap();
    assert_eq!((three.summary.tasks, three.summary.succeeded), (301, 301));
    let open_lanes = LoadSpec {
        submitters: 2,
        ..spec(open, "noop", Limit::Tasks(301))
    };
    let two = load::run(driver, &open_lanes).unwrap();
    assert_eq!((two.summary.tasks, two.summary.succeeded), (301, 301));

    let one = Mode::Closed {
        in_flight: 4,
        batch: 1,
    };
    let failing = load::run(driver, &spec(one, "fail:1", Limit::Tasks(20))).unwrap();
    assert_eq!(failing.summary.tasks, 20);
    assert_eq!(failing.summary.succeeded, 0);
    assert_eq!(failing.summary.failed, 20);
    cluster.stop();
}

/// A closed loop whose jobs fill the window (it waits for all of them before the next, and
/// the last job is smaller), one with fewer tasks than a batch, and one that stops on time:
/// each measures exactly the tasks it sent.
#[test]
fn closed_loops_that_wait_for_a_whole_window_or_stop_on_time_count_every_task() {
    let cluster = cluster();
    let driver = &cluster.driver;
    let whole = Mode::Closed {
        in_flight: 4,
        batch: 4,
    };
    for tasks in [1_001, 3] {
        let run = load::run(driver, &spec(whole, "noop", Limit::Tasks(tasks))).unwrap();
        assert_eq!((run.summary.tasks, run.summary.succeeded), (tasks, tasks));
        assert_eq!(run.histogram.len(), tasks);
        assert_eq!(run.timeline.iter().sum::<u64>(), tasks);
    }
    let timed = load::run(
        driver,
        &spec(whole, "noop", Limit::Duration(Duration::from_millis(200))),
    )
    .unwrap();
    let tasks = timed.summary.tasks;
    assert!(tasks > 0);
    assert_eq!(
        (timed.summary.succeeded, timed.histogram.len()),
        (tasks, tasks)
    );
    assert_eq!(timed.timeline.iter().sum::<u64>(), tasks);
    cluster.stop();
}
