//! Issue 13: an idle embedded driver woke up about 100 times a second (a fixed 10 ms tick). Now
//! it ticks only while jobs are active (or, slower, while connections need watching): idle, its
//! loop thread sleeps. Counted from the kernel: a thread's voluntary context switches are the
//! times it went to sleep, one per wake-up.

use std::time::Duration;

use bytes::Bytes;
use flint_net::driver::Driver;
use flint_net::job::{Job, JobOutcome};
use flint_net::Registry;

/// Voluntary context switches of each of this process's threads named `name`.
fn switches(name: &str) -> Vec<u64> {
    let mut counts = Vec::new();
    for task in std::fs::read_dir("/proc/self/task")
        .expect("/proc")
        .flatten()
    {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim() != name {
            continue;
        }
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        if let Some(n) = status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|n| n.trim().parse().ok())
        {
            counts.push(n);
        }
    }
    counts
}

#[test]
fn an_idle_driver_does_not_wake_up() {
    let remote = Driver::builder().start().expect("driver starts");
    let local = Driver::builder()
        .local(1, Registry::with_builtins())
        .start()
        .expect("driver starts");
    // Busy first, then idle: the tick must stop when the last job ends.
    let handle = local
        .submit(Job::new("sleep:30", vec![Bytes::new(); 3]))
        .expect("submitted");
    assert!(matches!(handle.wait(), JobOutcome::Succeeded(_)));
    let before = switches("flint-driver-0");
    assert_eq!(before.len(), 2, "two driver loops: {before:?}");
    // A fixed window: what is measured is how often the threads wake in it.
    let window = Duration::from_secs(2);
    std::thread::sleep(window);
    let after = switches("flint-driver-0");
    let woke: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    assert!(
        woke.iter().all(|&n| n <= 2),
        "idle driver loops woke {woke:?} times in {window:?} (a 10 ms tick is ~200)"
    );
    drop(remote);
}
