//! How long a big job with locality holds the driver's loop, as callers see it: one-task jobs
//! of a higher priority run back to back on another thread while the big job is submitted,
//! built and run, and wait for the loop whenever it is busy with the big job.
//!
//!     cargo run --release -p flint-bench --example located_hold [TASKS] [ROUNDS] [local]
//!
//! Local mode, 2 cores; the big job's tasks each prefer two of 100 hosts (as a block's
//! replicas), `noop`; with `local`, the first of the two is the local executor's host, so the
//! tasks run at the host level, given out by the locality pass. Prints, per round, how long `submit` took on the caller's thread, how
//! long the big job took from its submission to its outcome, and the one-task jobs' latency
//! while it was active: p50, p99 and the slowest; then the medians over the rounds.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use flint_engine::functions::Registry;
use flint_net::driver::Driver;
use flint_net::job::{Job, TaskLocality};

const HOSTS: usize = 100;
const DEADLINE: Duration = Duration::from_secs(120);

fn main() {
    let mut args = std::env::args().skip(1);
    let tasks: usize = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(5);
    let local = args.next().as_deref() == Some("local");
    let driver = Arc::new(
        Driver::builder()
            .local(2, Registry::with_builtins())
            .start()
            .expect("a local driver"),
    );
    // (when it was submitted, its latency) of each one-task job, while `measuring`.
    let latencies = Arc::new(Mutex::new(Vec::<(Instant, Duration)>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let small = {
        let (driver, latencies, stop) = (driver.clone(), latencies.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let start = Instant::now();
                let job = Job::new("noop", vec![Bytes::new()]).priority(10);
                let handle = driver.submit(job).expect("submitted");
                handle.wait_timeout(DEADLINE).expect("done");
                let mut all = latencies.lock().unwrap_or_else(|p| p.into_inner());
                all.push((start, start.elapsed()));
            }
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    // One shared name per host, as `TaskLocality::hosts` asks.
    let hosts: Vec<std::sync::Arc<str>> = (0..HOSTS).map(|h| format!("host{h}").into()).collect();
    // Local mode's executor is on this host.
    let here: std::sync::Arc<str> = "localhost".into();
    let mut figures = Vec::new();
    for round in 0..rounds {
        let payloads: Vec<Bytes> = (0..tasks).map(|_| Bytes::new()).collect();
        let locality: Vec<TaskLocality> = (0..tasks)
            .map(|i| TaskLocality {
                executors: Vec::new(),
                hosts: vec![
                    if local {
                        here.clone()
                    } else {
                        hosts[i % HOSTS].clone()
                    },
                    hosts[(i * 7 + 3) % HOSTS].clone(),
                ],
            })
            .collect();
        let big = Job::new("noop", payloads)
            .keep_results(false)
            .locality(locality);
        let start = Instant::now();
        let big = driver.submit(big).expect("submitted");
        let submitted = start.elapsed();
        big.wait_timeout(DEADLINE).expect("done");
        let end = Instant::now();
        let whole = end - start;
        let mut during: Vec<Duration> = (latencies.lock().unwrap_or_else(|p| p.into_inner()))
            .iter()
            .filter(|(at, latency)| *at + *latency >= start && *at <= end)
            .map(|(_, latency)| *latency)
            .collect();
        during.sort();
        let at = |q: f64| during[((during.len() - 1) as f64 * q) as usize];
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        let row = [
            ms(submitted),
            ms(whole),
            us(at(0.5)),
            us(at(0.99)),
            us(at(1.0)),
        ];
        println!(
            "round {round}: submit {:.1} ms, done in {:.0} ms; {} one-task jobs meanwhile: p50 {:.0} us, p99 {:.0} us, slowest {:.0} us",
            row[0],
            row[1],
            during.len(),
            row[2],
            row[3],
            row[4]
        );
        figures.push(row);
    }
    stop.store(true, Ordering::Relaxed);
    small.join().expect("the one-task jobs' thread");
    let median = |k: usize| {
        let mut v: Vec<f64> = figures.iter().map(|r| r[k]).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!(
        "median of {rounds} rounds ({tasks} tasks): submit {:.1} ms, done in {:.0} ms; one-task jobs p50 {:.0} us, p99 {:.0} us, slowest {:.0} us",
        median(0),
        median(1),
        median(2),
        median(3),
        median(4)
    );
}
