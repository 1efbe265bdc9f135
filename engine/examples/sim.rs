//! Runs the cluster simulator over many seeds: `sim N [FIRST]` runs seeds FIRST..FIRST+N
//! (FIRST defaults to 0), `sim --seed S` replays one seed (with `SIM_VERBOSE=1`, printing
//! every event), `sim --against-walk N [FIRST]` runs each seed twice, the second time with a
//! scheduler that walks for every assignment, and checks that both report the same (the
//! shortcuts that spare walks change nothing). Exits non-zero on the first failing seed,
//! printing the command that replays it.

use std::process::ExitCode;

use flint_engine::sim::{run_seed, run_seed_verbose, run_seed_walking, SimReport};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let parse = |s: Option<&String>, default: u64| -> Option<u64> {
        match s {
            None => Some(default),
            Some(s) => s.parse().ok(),
        }
    };
    if args.first().map(String::as_str) == Some("--seed") {
        let Some(seed) = parse(args.get(1), 0) else {
            eprintln!("usage: sim --seed S");
            return ExitCode::from(2);
        };
        let verbose = std::env::var_os("SIM_VERBOSE").is_some();
        let run = if verbose { run_seed_verbose } else { run_seed };
        return match run(seed) {
            Ok(r) => {
                println!("seed {seed} passed: {r:?}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{e}");
                ExitCode::FAILURE
            }
        };
    }
    let against_walk = args.first().map(String::as_str) == Some("--against-walk");
    let args = &args[usize::from(against_walk)..];
    let (Some(n), Some(first)) = (parse(args.first(), 1000), parse(args.get(1), 0)) else {
        eprintln!("usage: sim N [FIRST] | sim --seed S | sim --against-walk N [FIRST]");
        return ExitCode::from(2);
    };
    if against_walk {
        for seed in first..first.saturating_add(n) {
            let (shortcuts, walking) = (run_seed(seed), run_seed_walking(seed));
            // A seed that fails either way fails here too, even if both fail alike.
            if let Some(Err(e)) = [&shortcuts, &walking].into_iter().find(|r| r.is_err()) {
                eprintln!("{e}");
                return ExitCode::FAILURE;
            }
            if shortcuts != walking {
                eprintln!(
                    "seed {seed}: the scheduler's shortcuts and a walk per assignment differ \
                     (replay: SIM_VERBOSE=1 ci/sim --engine --seed {seed})\n  shortcuts: \
                     {shortcuts:?}\n  walking:   {walking:?}"
                );
                return ExitCode::FAILURE;
            }
        }
        println!("{n} seeds from {first}: the shortcuts and a walk per assignment agree");
        return ExitCode::SUCCESS;
    }
    let mut total = SimReport::default();
    for seed in first..first.saturating_add(n) {
        match run_seed(seed) {
            Ok(r) => {
                total.steps += r.steps;
                total.jobs += r.jobs;
                total.jobs_refused += r.jobs_refused;
                for (t, x) in total.outcomes.iter_mut().zip(r.outcomes) {
                    *t += x;
                }
                total.tasks += r.tasks;
                total.launched += r.launched;
                total.failures_injected += r.failures_injected;
                total.executors_lost += r.executors_lost;
                total.refusals += r.refusals;
                total.ignored_updates += r.ignored_updates;
                total.speculative += r.speculative;
            }
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::FAILURE;
            }
        }
    }
    println!(
        "{n} seeds from {first} passed: {} jobs ({} refused by backpressure; {} succeeded, {} \
         failed, {} cancelled), {} tasks, {} attempts launched ({} speculative), {} failures \
         injected, {} executors lost, {} registrations refused, {} updates ignored, {} steps",
        total.jobs,
        total.jobs_refused,
        total.outcomes[0],
        total.outcomes[1],
        total.outcomes[2],
        total.tasks,
        total.launched,
        total.speculative,
        total.failures_injected,
        total.executors_lost,
        total.refusals,
        total.ignored_updates,
        total.steps
    );
    ExitCode::SUCCESS
}
