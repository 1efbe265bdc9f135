use super::*;

const S: u64 = 1_000_000;

fn worker(id: &str, cores: u32, memory_mb: u64) -> WorkerSpec {
    WorkerSpec {
        id: id.into(),
        host: format!("host-{id}"),
        port: 7078,
        cores,
        memory_mb,
    }
}

fn app(cores_per_executor: u32, max_cores: u32, memory_mb: u64) -> AppSpec {
    AppSpec {
        name: "test".into(),
        driver_addr: "127.0.0.1:1".into(),
        cores_per_executor,
        max_cores,
        memory_mb,
        ..AppSpec::default()
    }
}

fn master(spread_out: bool) -> Master {
    Master::new(
        Config {
            worker_timeout_us: 2 * S,
            spread_out,
            max_executor_retries: 3,
            recovery_timeout_us: 5 * S,
            ..Config::default()
        },
        "app-test",
    )
}

fn drain(m: &mut Master) -> Vec<Output> {
    std::iter::from_fn(|| m.poll_output()).collect()
}

/// Launches per worker, in output order.
fn launches(outputs: &[Output]) -> Vec<(String, String)> {
    outputs
        .iter()
        .filter_map(|o| match o {
            Output::LaunchExecutor {
                worker, executor, ..
            } => Some((worker.clone(), executor.clone())),
            _ => None,
        })
        .collect()
}

fn per_worker(outputs: &[Output]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for (w, _) in launches(outputs) {
        *counts.entry(w).or_insert(0) += 1;
    }
    counts
}

#[test]
fn an_app_without_a_maximum_gets_the_default_cores_and_leaves_the_rest_to_others() {
    let mut m = Master::new(
        Config {
            default_cores: 2,
            ..Config::default()
        },
        "app",
    );
    m.handle_worker_registered(worker("w1", 2, 1000), 0)
        .expect("w1");
    m.handle_worker_registered(worker("w2", 2, 1000), 0)
        .expect("w2");
    let greedy = m.handle_app_registered(app(1, 0, 0), 0).expect("greedy");
    assert_eq!(launches(&drain(&mut m)).len(), 2);
    let status = m.status();
    assert!(
        status.apps[0]
            .waiting
            .contains("default maximum of 2 cores"),
        "{:?}",
        status.apps[0]
    );
    let other = m.handle_app_registered(app(1, 2, 0), 0).expect("other");
    assert_eq!(launches(&drain(&mut m)).len(), 2);
    let status = m.status();
    let granted = |id: &str| {
        status
            .apps
            .iter()
            .find(|a| a.id == id)
            .map(|a| a.cores_granted)
    };
    assert_eq!((granted(&greedy), granted(&other)), (Some(2), Some(2)));
}

#[test]
fn a_request_no_worker_can_fit_says_so() {
    let mut m = master(true);
    m.handle_worker_registered(worker("w1", 2, 1000), 0)
        .expect("w1");
    m.handle_app_registered(app(4, 4, 0), 0).expect("app");
    let status = m.status();
    assert!(
        status.apps[0].waiting.starts_with(NO_WORKER_FITS),
        "{:?}",
        status.apps[0]
    );
    assert!(
        status.apps[0].waiting.contains("2 cores"),
        "{:?}",
        status.apps[0]
    );
}

#[test]
fn an_executor_stuck_launching_fails_and_is_placed_on_another_worker() {
    let mut m = Master::new(
        Config {
            launch_timeout_us: S,
            ..Config::default()
        },
        "app",
    );
    m.handle_worker_registered(worker("stuck", 8, 1000), 0)
        .expect("stuck");
    m.handle_worker_registered(worker("good", 2, 1000), 0)
        .expect("good");
    let id = m.handle_app_registered(app(1, 1, 0), 0).expect("app");
    // Most free cores first: the stuck worker gets it.
    assert_eq!(
        launches(&drain(&mut m)),
        vec![("stuck".to_string(), "0".to_string())]
    );
    m.handle_worker_heartbeat("stuck", S / 2);
    m.handle_worker_heartbeat("good", S / 2);
    m.handle_timeout(S / 2);
    assert!(launches(&drain(&mut m)).is_empty());
    m.handle_worker_heartbeat("stuck", S + S / 2);
    m.handle_worker_heartbeat("good", S + S / 2);
    m.handle_timeout(S + S / 2);
    let outputs = drain(&mut m);
    assert!(outputs.iter().any(|o| matches!(o,
        Output::KillExecutor { worker, executor, .. } if worker == "stuck" && executor == "0")));
    assert!(outputs.iter().any(|o| matches!(o,
        Output::ExecutorUpdated { executor, state: ProcessState::Failed, .. } if executor == "0")));
    assert_eq!(
        launches(&outputs),
        vec![("good".to_string(), "1".to_string())]
    );
    // A RUNNING report from the stuck worker after the fact is ignored.
    m.handle_executor_state("stuck", &id, "0", ProcessState::Running, "late", None);
    assert_eq!(m.status().executors.len(), 1);
}

#[test]
fn spread_out_places_one_executor_per_worker_in_turn() {
    let mut m = master(true);
    for id in ["a", "b", "c"] {
        m.handle_worker_registered(worker(id, 4, 4096), 0).unwrap();
    }
    let id = m.handle_app_registered(app(1, 6, 512), 0).unwrap();
    assert_eq!(id, "app-test-0001");
    let out = drain(&mut m);
    let counts = per_worker(&out);
    assert_eq!(counts.values().copied().collect::<Vec<_>>(), vec![2, 2, 2]);
    assert!(out
        .iter()
        .any(|o| matches!(o, Output::ExecutorAdded { .. })));
}

#[test]
fn packed_fills_the_worker_with_most_free_cores_first() {
    let mut m = master(false);
    m.handle_worker_registered(worker("a", 2, 4096), 0).unwrap();
    m.handle_worker_registered(worker("b", 8, 4096), 0).unwrap();
    m.handle_app_registered(app(2, 6, 0), 0).unwrap();
    let counts = per_worker(&drain(&mut m));
    assert_eq!(counts.get("b"), Some(&3));
    assert_eq!(counts.get("a"), None);
}

#[test]
fn a_worker_claiming_huge_resources_gets_a_bounded_number_of_executors() {
    let mut m = master(true);
    m.handle_worker_registered(worker("a", u32::MAX, u64::MAX), 0)
        .unwrap();
    m.handle_app_registered(app(1, 0, 0), 0).unwrap();
    assert_eq!(launches(&drain(&mut m)).len(), 10_000);
}

#[test]
fn memory_limits_placement() {
    let mut m = master(true);
    m.handle_worker_registered(worker("a", 8, 1000), 0).unwrap();
    m.handle_app_registered(app(1, 0, 400), 0).unwrap();
    assert_eq!(launches(&drain(&mut m)).len(), 2);
    let status = m.status();
    assert_eq!(status.workers[0].memory_used_mb, 800);
    assert_eq!(status.workers[0].cores_used, 2);
}

#[test]
fn waiting_apps_are_served_fifo_as_resources_free_up() {
    let mut m = master(true);
    m.handle_worker_registered(worker("a", 2, 4096), 0).unwrap();
    let first = m.handle_app_registered(app(2, 2, 0), 0).unwrap();
    let second = m.handle_app_registered(app(2, 2, 0), 0).unwrap();
    let third = m.handle_app_registered(app(2, 2, 0), 0).unwrap();
    let out = drain(&mut m);
    assert_eq!(launches(&out).len(), 1);
    assert!(out
        .iter()
        .any(|o| matches!(o, Output::LaunchExecutor { app, .. } if *app == first)));
    m.handle_app_unregistered(&first);
    let out = drain(&mut m);
    let launched: Vec<&String> = out
        .iter()
        .filter_map(|o| match o {
            Output::LaunchExecutor { app, .. } => Some(app),
            _ => None,
        })
        .collect();
    assert_eq!(launched, vec![&second]);
    assert!(out.iter().any(
        |o| matches!(o, Output::ApplicationFinished { worker, app } if worker == "a" && *app == first)
    ));
    let _ = third;
}

#[test]
fn a_duplicate_alive_worker_is_refused_and_a_dead_one_may_come_back() {
    let mut m = master(true);
    m.handle_worker_registered(worker("a", 2, 100), 0).unwrap();
    let refusal = m
        .handle_worker_registered(worker("a", 2, 100), 0)
        .unwrap_err();
    assert!(refusal.contains("duplicate worker id"), "{refusal}");
    m.handle_timeout(3 * S);
    assert!(!m.is_worker_alive("a"));
    m.handle_worker_registered(worker("a", 2, 100), 3 * S)
        .unwrap();
    assert!(m.is_worker_alive("a"));
}

#[test]
fn a_silent_worker_is_removed_its_executors_lost_and_replaced_elsewhere() {
    let mut m = master(true);
    m.handle_worker_registered(worker("a", 2, 4096), 0).unwrap();
    m.handle_worker_registered(worker("b", 2, 4096), 0).unwrap();
    let id = m.handle_app_registered(app(1, 2, 0), 0).unwrap();
    let out = drain(&mut m);
    assert_eq!(per_worker(&out).len(), 2);
    m.handle_worker_heartbeat("b", S + S / 2);
    assert_eq!(
        m.poll_timeout(),
        Some(2 * S + 1),
        "a's heartbeat deadline first"
    );
    m.handle_timeout(2 * S + 1);
    let out = drain(&mut m);
    assert!(out.iter().any(|o| matches!(o,
        Output::ExecutorUpdated { app, state: ProcessState::Lost, .. } if *app == id)));
    assert!(out.iter().any(|o| matches!(o,
        Output::WorkerRemoved { worker, apps, .. } if worker == "a" && apps == &vec![id.clone()])));
    // The replacement goes to the only worker left.
    assert_eq!(launches(&out), vec![("b".to_owned(), "2".to_owned())]);
    assert!(!m.handle_worker_heartbeat("a", 2 * S + 2));
    assert_eq!(
        m.poll_timeout(),
        Some(S + S / 2 + 2 * S + 1),
        "b's deadline (before its replacement launch's, 30 s after placing)"
    );
}

#[test]
fn too_many_abnormal_exits_with_none_running_remove_the_app() {
    let mut m = master(true);
    m.handle_worker_registered(worker("a", 1, 4096), 0).unwrap();
    let id = m.handle_app_registered(app(1, 1, 0), 0).unwrap();
    let mut out = drain(&mut m);
    for round in 0..3 {
        let (w, e) = launches(&out).pop().expect("a launch");
        m.handle_executor_state(&w, &id, &e, ProcessState::Failed, "boom", Some(1));
        out = drain(&mut m);
        if round < 2 {
            assert_eq!(launches(&out).len(), 1, "relaunched after failure {round}");
        }
    }
    let removed = out.iter().find_map(|o| match o {
        Output::ApplicationRemoved { state, reason, .. } => Some((*state, reason.clone())),
        _ => None,
    });
    let (state, reason) = removed.expect("removed");
    assert_eq!(state, AppState::Failed);
    assert!(reason.contains("max executor retries 3"), "{reason}");
    assert!(reason.contains("boom"), "{reason}");
    assert_eq!(
        m.status().apps.last().map(|a| a.state),
        Some(AppState::Failed)
    );
}

#[test]
fn an_app_with_a_running_executor_survives_failures_of_its_others() {
    let mut m = master(true);
    m.handle_worker_registered(worker("a", 2, 4096), 0).unwrap();
    let id = m.handle_app_registered(app(1, 2, 0), 0).unwrap();
    let mut out = drain(&mut m);
    let mut launched = launches(&out);
    let (w, steady) = launched.remove(0);
    m.handle_executor_state(&w, &id, &steady, ProcessState::Running, "", None);
    for _ in 0..10 {
        let (w, e) = launched.pop().expect("a launch");
        m.handle_executor_state(&w, &id, &e, ProcessState::Running, "", None);
        m.handle_executor_state(&w, &id, &e, ProcessState::Failed, "boom", Some(1));
        out = drain(&mut m);
        launched = launches(&out);
    }
    assert!(m.app_spec(&id).is_some(), "still registered");
    // Once the steady one fails too, none is running: the count is far past the limit.
    m.handle_executor_state(&w, &id, &steady, ProcessState::Failed, "boom", Some(1));
    assert!(m.app_spec(&id).is_none(), "removed");
}

#[test]
fn request_and_kill_executors() {
    let mut m = master(true);
    m.handle_worker_registered(worker("a", 8, 4096), 0).unwrap();
    let id = m.handle_app_registered(app(1, 0, 0), 0).unwrap();
    m.handle_request_executors(&id, 0);
    drain(&mut m);
    let executors = |m: &Master| m.status().executors.len();
    // Unlimited by default: it took all 8 cores before the request came.
    assert_eq!(executors(&m), 8);
    m.handle_kill_executors(&id, &["0", "1", "nope"]);
    let out = drain(&mut m);
    assert_eq!(
        out.iter()
            .filter(|o| matches!(o, Output::KillExecutor { .. }))
            .count(),
        2
    );
    assert_eq!(executors(&m), 6);
    m.handle_request_executors(&id, 7);
    assert_eq!(launches(&drain(&mut m)).len(), 1);
    assert_eq!(executors(&m), 7);
}

#[test]
fn recovery_adopts_running_executors_and_removes_what_did_not_come_back() {
    let mut m = master(true);
    let spec = app(1, 2, 0);
    m.handle_recover(
        vec![worker("a", 2, 4096), worker("b", 2, 4096)],
        vec![
            RecoveredApp {
                id: "app-old-0001".into(),
                spec: spec.clone(),
                executor_limit: Some(2),
                next_executor: 2,
            },
            RecoveredApp {
                id: "app-old-0002".into(),
                spec,
                executor_limit: None,
                next_executor: 0,
            },
        ],
        0,
    );
    assert!(m.is_recovering());
    m.handle_worker_registered(worker("a", 2, 4096), S).unwrap();
    assert!(m.handle_executor_reattached("a", "app-old-0001", "0"));
    assert!(m.handle_executor_reattached("a", "app-old-0001", "1"));
    assert!(!m.handle_executor_reattached("a", "app-old-0001", "7"));
    m.handle_app_reconnected("app-old-0001", S).unwrap();
    let out = drain(&mut m);
    assert_eq!(launches(&out), vec![], "nothing placed while recovering");
    assert!(out
        .iter()
        .any(|o| matches!(o, Output::KillExecutor { executor, .. } if executor == "7")));
    assert!(m.handle_worker_heartbeat("a", 5 * S));
    m.handle_timeout(6 * S);
    let out = drain(&mut m);
    assert!(out.iter().any(|o| matches!(o,
        Output::WorkerRemoved { worker, .. } if worker == "b")));
    assert!(out.iter().any(|o| matches!(o,
        Output::ApplicationRemoved { app, state: AppState::Killed, .. } if app == "app-old-0002")));
    assert_eq!(
        launches(&out),
        vec![],
        "the adopted executors fill the request"
    );
    assert!(!m.is_recovering());
    let status = m.status();
    assert_eq!(status.executors.len(), 2);
    assert_eq!(status.workers[0].cores_used, 2);
    // A new app gets an id with this master's prefix.
    assert_eq!(
        m.handle_app_registered(app(1, 1, 0), 6 * S).unwrap(),
        "app-test-0003"
    );
}

#[test]
fn recovery_ends_early_when_everything_came_back() {
    let mut m = master(true);
    m.handle_recover(vec![worker("a", 2, 4096)], vec![], 0);
    m.handle_worker_registered(worker("a", 2, 4096), S).unwrap();
    assert!(m.is_recovering(), "recovery ends on a tick");
    m.handle_timeout(S);
    assert!(!m.is_recovering());
}

#[test]
fn reports_from_the_wrong_worker_are_ignored() {
    let mut m = master(true);
    m.handle_worker_registered(worker("a", 1, 4096), 0).unwrap();
    m.handle_worker_registered(worker("b", 1, 4096), 0).unwrap();
    let id = m.handle_app_registered(app(1, 1, 0), 0).unwrap();
    let out = drain(&mut m);
    let (w, e) = launches(&out).pop().expect("a launch");
    let other = if w == "a" { "b" } else { "a" };
    m.handle_executor_state(other, &id, &e, ProcessState::Failed, "x", Some(1));
    assert!(drain(&mut m).is_empty());
    assert_eq!(m.status().executors.len(), 1);
}
