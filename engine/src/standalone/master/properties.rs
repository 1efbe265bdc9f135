use super::*;
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    RegisterWorker(u8, u32, u64),
    LoseWorker(u8),
    Heartbeat(u8),
    Advance(u64),
    RegisterApp(u32, u32, u64),
    UnregisterApp(u8),
    Request(u8, u32),
    Kill(u8, u8),
    Report(u8, u8, u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u8..4, 0u32..6, 0u64..3000).prop_map(|(w, c, m)| Op::RegisterWorker(w, c, m)),
        (0u8..4).prop_map(Op::LoseWorker),
        (0u8..4).prop_map(Op::Heartbeat),
        (0u64..3_000_000).prop_map(Op::Advance),
        (0u32..3, 0u32..8, 0u64..1500).prop_map(|(c, m, mem)| Op::RegisterApp(c, m, mem)),
        (0u8..4).prop_map(Op::UnregisterApp),
        (0u8..4, 0u32..6).prop_map(|(a, n)| Op::Request(a, n)),
        (0u8..4, 0u8..8).prop_map(|(a, e)| Op::Kill(a, e)),
        (0u8..4, 0u8..8, 0u8..6).prop_map(|(a, e, s)| Op::Report(a, e, s)),
    ]
}

const STATES: [ProcessState; 6] = [
    ProcessState::Launching,
    ProcessState::Running,
    ProcessState::Killed,
    ProcessState::Failed,
    ProcessState::Lost,
    ProcessState::Exited,
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn placement_never_oversubscribes_and_only_targets_alive_workers(ops in proptest::collection::vec(op(), 1..80)) {
        let mut m = Master::new(
            Config { worker_timeout_us: 2_000_000, max_executor_retries: 3, ..Config::default() },
            "app",
        );
        let mut now = 0u64;
        let mut apps: Vec<String> = Vec::new();
        // executor -> (worker, app)
        let mut placed: BTreeMap<(String, String), String> = BTreeMap::new();
        for op in ops {
            match op {
                Op::RegisterWorker(w, cores, memory_mb) => {
                    let _ = m.handle_worker_registered(WorkerSpec {
                        id: format!("w{w}"), host: "h".into(), port: 1, cores, memory_mb,
                    }, now);
                }
                Op::LoseWorker(w) => m.handle_worker_lost(&format!("w{w}"), "test"),
                Op::Heartbeat(w) => { m.handle_worker_heartbeat(&format!("w{w}"), now); }
                Op::Advance(us) => { now += us; m.handle_timeout(now); }
                Op::RegisterApp(cores, max_cores, memory_mb) => {
                    if let Ok(id) = m.handle_app_registered(AppSpec {
                        cores_per_executor: cores, max_cores, memory_mb, ..AppSpec::default()
                    }, now) {
                        apps.push(id);
                    }
                }
                Op::UnregisterApp(a) => {
                    if let Some(app) = apps.get(a as usize) { m.handle_app_unregistered(app); }
                }
                Op::Request(a, n) => {
                    if let Some(app) = apps.get(a as usize) { m.handle_request_executors(app, n); }
                }
                Op::Kill(a, e) => {
                    if let Some(app) = apps.get(a as usize) { m.handle_kill_executors(app, &[&e.to_string()]); }
                }
                Op::Report(a, e, s) => {
                    if let Some(app) = apps.get(a as usize) {
                        let executor = e.to_string();
                        if let Some(worker) = placed.get(&(app.clone(), executor.clone())) {
                            m.handle_executor_state(worker, app, &executor, STATES[s as usize], "x", Some(1));
                        }
                    }
                }
            }
            let outputs: Vec<Output> = std::iter::from_fn(|| m.poll_output()).collect();
            for (i, output) in outputs.iter().enumerate() {
                if let Output::LaunchExecutor { worker, app, executor, .. } = output {
                    // Alive now, or removed by the same event after the launch was sent.
                    let removed_later = outputs.get(i..).unwrap_or_default().iter().any(|o| {
                        matches!(o, Output::WorkerRemoved { worker: w, .. } if w == worker)
                    });
                    prop_assert!(m.is_worker_alive(worker) || removed_later, "launch on a dead worker");
                    placed.insert((app.clone(), executor.clone()), worker.clone());
                }
            }
            let status = m.status();
            for w in &status.workers {
                let on_it: Vec<&ExecutorView> =
                    status.executors.iter().filter(|e| e.worker == w.spec.id).collect();
                let cores: u32 = on_it.iter().map(|e| e.cores).sum();
                prop_assert_eq!(cores, w.cores_used);
                prop_assert!(w.cores_used <= w.spec.cores);
                prop_assert!(w.memory_used_mb <= w.spec.memory_mb);
                if w.state != WorkerState::Alive {
                    prop_assert!(on_it.is_empty(), "executors on a dead worker");
                }
            }
            for a in &status.apps {
                if let Some(spec) = m.app_spec(&a.id) {
                    if spec.max_cores > 0 {
                        prop_assert!(a.cores_granted <= spec.max_cores);
                    }
                }
            }
        }
    }
}
