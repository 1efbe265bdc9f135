//! The deterministic cluster simulator over many seeds (CI runs 1,000; `ci/sim N` runs more in
//! release). Each seed checks the scheduler's invariants after every step.

use flint_engine::sim::{run_seed, SimReport};

/// Seeds per `cargo test` run; `SIM_SEEDS` overrides (e.g. for a longer local run).
fn seeds() -> u64 {
    std::env::var("SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000)
}

#[test]
fn simulator_invariants_hold_over_many_seeds() {
    let mut total = SimReport::default();
    for seed in 0..seeds() {
        let r = run_seed(seed).unwrap_or_else(|e| panic!("{e}"));
        total.jobs += r.jobs;
        total.tasks += r.tasks;
        total.failures_injected += r.failures_injected;
        total.executors_lost += r.executors_lost;
        total.speculative += r.speculative;
        total.refusals += r.refusals;
        total.ignored_updates += r.ignored_updates;
        total.jobs_refused += r.jobs_refused;
        for (t, x) in total.outcomes.iter_mut().zip(r.outcomes) {
            *t += x;
        }
    }
    // The scenarios really exercise what the invariants are about.
    assert!(total.tasks > 10 * seeds(), "{total:?}");
    assert!(total.failures_injected > 0, "{total:?}");
    assert!(total.executors_lost > 0, "{total:?}");
    assert!(total.speculative > 0, "{total:?}");
    assert!(total.refusals > 0, "{total:?}");
    assert!(total.ignored_updates > 0, "{total:?}");
    assert!(total.jobs_refused > 0, "{total:?}");
    assert!(total.outcomes.iter().all(|&n| n > 0), "{total:?}");
}

#[test]
fn a_seed_replays_identically() {
    for seed in [3, 77, 1234] {
        assert_eq!(run_seed(seed), run_seed(seed));
    }
}
