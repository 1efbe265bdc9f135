//! Runs the cluster simulator (the real driver and executor cores on a simulated network, see
//! `flint_net::sim`) over many seeds: `cluster_sim N [FIRST]` runs seeds FIRST..FIRST+N (FIRST
//! defaults to 0), `cluster_sim --seed S` replays one seed (with `SIM_VERBOSE=1`, printing every
//! event and the cores' logs). Exits non-zero on the first failing seed, printing the command
//! that replays it.

use std::process::ExitCode;
use std::time::Instant;

use flint_net::sim::{run_seed, SimReport};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let parse = |s: Option<&String>, default: u64| -> Option<u64> {
        match s {
            None => Some(default),
            Some(s) => s.parse().ok(),
        }
    };
    if std::env::var_os("SIM_VERBOSE").is_some() {
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_writer(std::io::stderr)
            .without_time()
            .init();
    }
    if args.first().map(String::as_str) == Some("--seed") {
        let Some(seed) = parse(args.get(1), 0) else {
            eprintln!("usage: cluster_sim --seed S");
            return ExitCode::from(2);
        };
        return match run_seed(seed) {
            Ok(r) => {
                println!("cluster seed {seed} passed: {r:?}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{e}");
                ExitCode::FAILURE
            }
        };
    }
    let (Some(n), Some(first)) = (parse(args.first(), 1000), parse(args.get(1), 0)) else {
        eprintln!("usage: cluster_sim N [FIRST] | cluster_sim --seed S");
        return ExitCode::from(2);
    };
    let started = Instant::now();
    let mut total = SimReport::default();
    for seed in first..first.saturating_add(n) {
        match run_seed(seed) {
            Ok(r) => total.add(&r),
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "cluster: {n} seeds from {first} passed in {secs:.1} s ({:.0} seeds/s): {} jobs ({} \
         succeeded, {} failed, {} cancelled), {} tasks, {} attempts launched, {} executors ({} \
         refused, {} lanes past lane 0), {} faults ({} on one lane past 0), {} connections dropped as not reading, {} lies told, {} bytes in \
         {} chunks, {} steps, {} hedged copies, {} suspicions",
        n as f64 / secs.max(1e-9),
        total.jobs,
        total.outcomes[0],
        total.outcomes[1],
        total.outcomes[2],
        total.tasks,
        total.launched,
        total.executors,
        total.refused,
        total.lanes,
        total.faults,
        total.lane_faults,
        total.backlogged,
        total.lies,
        total.delivered.0,
        total.delivered.1,
        total.steps,
        total.hedges.0,
        total.hedges.1
    );
    ExitCode::SUCCESS
}
