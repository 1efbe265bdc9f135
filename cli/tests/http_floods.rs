//! A running `flint driver`'s HTTP port under attack (issue 25, item 5), with real processes:
//! the attacker is raw sockets from other loopback addresses (`observe::http::flood`), the good
//! client asks for the metrics and the page with the observe token from 127.0.0.2 every 50 ms
//! while a job runs. Each flood must leave every good request answered `200`, well within
//! [`GOOD_MAX`] (the goal is 1 s; `flint-flood` in bench/ measures the latencies and the job's
//! speed). Against the server before this one, the slow heads and the held connections turned
//! good requests into `503`s, and refusals were answered as fast as asked.

mod common;

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use common::cluster::{scratch, Proc, Scratch};
use common::free_port;
use flint_net::observe::http::flood::{self, Flood};

const SECRET: &str = "http-floods-test-secret";
/// The longest a good request may take in these tests (twice the goal: the machine is shared).
const GOOD_MAX: Duration = Duration::from_secs(2);
/// How long each flood lasts while the good client asks.
const FLOOD_FOR: Duration = Duration::from_secs(3);

fn ip(last: u8) -> IpAddr {
    IpAddr::from([127, 0, 0, last])
}

/// A driver running a long job on one executor, serving its page and metrics.
struct Target {
    _driver: Proc,
    _executor: Proc,
    http: SocketAddr,
    token: String,
    /// Last, so it goes after the processes.
    _dir: Scratch,
}

fn target(name: &str) -> Target {
    let dir = scratch(name);
    let listen = format!("127.0.0.1:{}", free_port());
    let http = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let driver = Proc::start_env(
        &dir,
        "driver",
        SECRET,
        &[
            "driver",
            "--listen",
            &listen,
            "--executors",
            "1",
            "--tasks",
            "1000000",
            "--task",
            "sleep:1",
            "--ui-listen",
            &http.to_string(),
        ],
        &[],
    );
    let executor = Proc::start_env(
        &dir,
        "executor",
        SECRET,
        &["executor", "--driver", &listen, "--cores", "2"],
        &[],
    );
    let token = driver.observe_token();
    common::wait_until("the job running", || {
        flood::get(ip(2), http, "/metrics", Some(&token), GOOD_MAX).is_ok_and(|a| {
            a.status == 200
                && a.text().contains("flint_tasks_succeeded_total")
                && !a.text().contains("flint_tasks_succeeded_total 0")
        })
    });
    Target {
        _driver: driver,
        _executor: executor,
        http,
        token,
        _dir: dir,
    }
}

/// Asks for the metrics and the page every 50 ms for [`FLOOD_FOR`]; each answer must be a
/// `200` within [`GOOD_MAX`]. The slowest answer.
fn good_requests(t: &Target, what: &str) -> Duration {
    let started = Instant::now();
    let mut slowest = Duration::ZERO;
    let mut asked = 0;
    while started.elapsed() < FLOOD_FOR {
        let path = if asked % 2 == 0 { "/metrics" } else { "/" };
        let answer = flood::get(ip(2), t.http, path, Some(&t.token), GOOD_MAX * 2)
            .unwrap_or_else(|e| panic!("{what}: GET {path} failed: {e}"));
        assert_eq!(answer.status, 200, "{what}: GET {path}: {}", answer.head);
        assert!(
            answer.took < GOOD_MAX,
            "{what}: GET {path} took {:?}",
            answer.took
        );
        slowest = slowest.max(answer.took);
        asked += 1;
        std::thread::sleep(Duration::from_millis(50));
    }
    println!("{what}: {asked} good requests, the slowest {slowest:?}");
    slowest
}

fn attackers() -> Vec<IpAddr> {
    (3..7).map(ip).collect()
}

#[test]
fn slow_heads_leave_good_requests_answered() {
    let t = target("slow");
    let attack = flood::slow_headers(attackers(), t.http, 300, Duration::from_millis(100));
    std::thread::sleep(Duration::from_millis(500));
    good_requests(&t, "300 slow heads");
    let stats = attack.stop();
    assert!(stats.connections >= 300, "{stats:?}");
}

#[test]
fn held_connections_leave_good_requests_answered() {
    common::raise_descriptor_limit(12_000);
    let t = target("held");
    let attack: Flood = flood::held(attackers(), t.http, 10_000);
    common::wait_until("10,000 connections opened", || {
        attack.stats().connections >= 10_000
    });
    good_requests(&t, "10,000 held connections");
    let stats = attack.stop();
    assert!(
        stats.closed > 0,
        "the server closed what it could not keep: {stats:?}"
    );
}

#[test]
fn unauthenticated_loops_are_paced_and_good_requests_answered() {
    let t = target("unauth");
    let started = Instant::now();
    let attack = flood::unauthenticated(ip(3), t.http, 16);
    good_requests(&t, "16 threads of unauthenticated requests");
    let stats = attack.stop();
    let seconds = started.elapsed().as_secs_f64();
    // The pace: 10 at once, then 5 a second from that address (plus those in flight).
    let bound = 10.0 + 5.0 * seconds + 16.0;
    assert!(
        (stats.answers as f64) <= bound,
        "{} refusals answered in {seconds:.1} s (at most {bound:.0}): refusals are not paced",
        stats.answers
    );
}
