//! Unit tests of ExecutorCore: frames in, actions and frames out, no sockets.

use super::*;
use crate::handshake::{Handshake, Secret};
use crate::wire::{Kind, TaskLaunch};

const FRAME_SIZE_MAX: usize = 4096;
const DRIVER: &[Role] = &[Role::Executor];

fn config(secret: Option<Secret>) -> ExecutorConfig {
    let mut config = ExecutorConfig::new(([127, 0, 0, 1], 1).into(), "e1");
    config.cores = 2;
    config.tasks_per_core = 2;
    config.frame_size_max = FRAME_SIZE_MAX;
    config.secret = secret;
    config
}

/// The frames the core transmits now.
fn sent(core: &mut ExecutorCore) -> Vec<Frame> {
    let mut out = BytesMut::new();
    core.poll_transmit(&mut out);
    let mut decoder = FrameDecoder::new(FRAME_SIZE_MAX);
    decoder.extend_from_slice(&out);
    let mut frames = Vec::new();
    while let Some(frame) = decoder.next_frame().expect("the core sends valid frames") {
        frames.push(frame);
    }
    assert_eq!(decoder.buffered_len(), 0, "only whole frames");
    frames
}

fn kinds(frames: &[Frame]) -> Vec<Kind> {
    frames
        .iter()
        .map(|f| Kind::from_u16(f.kind()).expect("known kind"))
        .collect()
}

/// Sends the driver's `message` to the core as bytes.
fn deliver(core: &mut ExecutorCore, message: &Message<'_>, now_us: u64) {
    let mut out = BytesMut::new();
    message.encode(&mut out, FRAME_SIZE_MAX).expect("encodes");
    core.handle_bytes(&out, now_us);
}

/// Plays the driver's side of the handshake; returns the core's frames after it.
fn handshake(core: &mut ExecutorCore, secret: Option<Secret>) -> Vec<Frame> {
    let mut to_core = BytesMut::new();
    let mut driver = Handshake::accept(Role::Driver, secret, [9; 32], DRIVER, &mut to_core);
    let mut authenticated = false;
    for _ in 0..4 {
        core.handle_bytes(&to_core.split(), 0);
        let frames = sent(core);
        let mut rest = Vec::new();
        for frame in frames {
            if authenticated {
                rest.push(frame);
                continue;
            }
            let done = driver
                .on_frame(frame.kind(), frame.body(), &mut to_core)
                .expect("the driver accepts the executor");
            authenticated = done == Some(Role::Executor);
        }
        if authenticated && to_core.is_empty() {
            return rest;
        }
    }
    panic!("the handshake did not finish");
}

/// A core past the handshake, registered at `now_us` with a heartbeat every `interval_ms`.
fn registered(interval_ms: u32, now_us: u64) -> ExecutorCore {
    let mut core = ExecutorCore::new(&config(None), [1; 32]);
    handshake(&mut core, None);
    let registered = Message::RegisteredExecutor {
        heartbeat_interval_ms: interval_ms,
        lane_key: [0; 32],
    };
    deliver(&mut core, &registered, now_us);
    core
}

/// Launches `tasks` (id, function, payload) as a driver does: each function defined (by the
/// order it first appears in) ahead of the launches naming it by index.
fn launch(core: &mut ExecutorCore, tasks: &[(u64, &str, &[u8])], now_us: u64) {
    let mut out = BytesMut::new();
    let mut names: Vec<&str> = Vec::new();
    for &(_, function, _) in tasks {
        if !names.contains(&function) {
            let index = names.len() as u32;
            names.push(function);
            let define = Message::DefineFunction {
                index,
                name: function,
            };
            define.encode(&mut out, FRAME_SIZE_MAX).expect("encodes");
        }
    }
    let index = |name: &str| names.iter().position(|n| *n == name).expect("defined") as u32;
    let launches: Vec<TaskLaunch> = tasks
        .iter()
        .map(|&(task_id, function, payload)| TaskLaunch {
            task_id,
            attempt: 0,
            cores: 1,
            function: index(function),
            payload,
        })
        .collect();
    batch::encode_launches(&launches, &mut out, FRAME_SIZE_MAX).expect("encodes");
    core.handle_bytes(&out, now_us);
}

/// What the core asked for, launches first (the order the endpoint carries them out in).
#[derive(Debug, PartialEq)]
enum Asked {
    Launch(flint_engine::scheduler::TaskLaunch),
    Kill(Attempt),
    KillAll,
}

/// What a one-core launch of attempt `attempt` of `task_id` becomes.
fn launched(task_id: u64, attempt: u32, function: &str, payload: Bytes) -> Asked {
    Asked::Launch(flint_engine::scheduler::TaskLaunch {
        task: TaskId(task_id),
        attempt,
        function: Arc::from(function),
        payload,
        cores: 1,
        speculative: false,
    })
}

fn actions(core: &mut ExecutorCore) -> Vec<Asked> {
    let mut asked: Vec<Asked> = core.poll_launches().map(Asked::Launch).collect();
    asked.extend(
        std::iter::from_fn(|| core.poll_action()).map(|action| match action {
            Action::Kill(attempt) => Asked::Kill(attempt),
            Action::KillAll => Asked::KillAll,
        }),
    );
    asked
}

fn done(task_id: u64, state: TaskState, data: &[u8]) -> TaskReport {
    TaskReport {
        task: TaskId(task_id),
        attempt: 0,
        state,
        data: Bytes::copy_from_slice(data),
    }
}

#[test]
fn the_first_bytes_are_a_hello_from_an_executor() {
    let mut core = ExecutorCore::new(&config(None), [1; 32]);
    let frames = sent(&mut core);
    assert_eq!(kinds(&frames), [Kind::Hello]);
    let hello = Message::decode_hello(frames[0].kind(), frames[0].body()).expect("a Hello");
    assert!(matches!(
        hello,
        Message::Hello { role: Role::Executor, nonce, .. } if nonce == [1; 32]
    ));
    assert_eq!(
        core.poll_timeout(),
        None,
        "no heartbeat before registration"
    );
}

#[test]
fn it_registers_after_the_handshake_with_or_without_a_secret() {
    for secret in [None, Some(Secret::new("s3cret").expect("secret"))] {
        let mut core = ExecutorCore::new(&config(secret.clone()), [1; 32]);
        let frames = handshake(&mut core, secret);
        assert_eq!(kinds(&frames), [Kind::RegisterExecutor]);
        let Ok(Message::RegisterExecutor {
            executor_id, cores, ..
        }) = frames[0].message()
        else {
            panic!("a RegisterExecutor");
        };
        assert_eq!((executor_id, cores), ("e1", 2));
    }
}

#[test]
fn lane_0_registers_the_lanes_and_hands_out_the_key_once_registered() {
    let mut core = ExecutorCore::new(&config(None), [1; 32]);
    let frames = handshake(&mut core, None);
    let Ok(Message::RegisterExecutor { lanes, cores, .. }) = frames[0].message() else {
        panic!("a RegisterExecutor");
    };
    assert_eq!((lanes, cores), (2, 2), "one lane per core");
    assert_eq!(core.lane_key(), None, "not before the driver answers");
    let registered = Message::RegisteredExecutor {
        heartbeat_interval_ms: 100,
        lane_key: [7; 32],
    };
    deliver(&mut core, &registered, 0);
    assert_eq!(core.lane_key(), Some([7; 32]));
    assert_eq!(core.lane(), 0);

    // One core: one lane, no key to hand out.
    let mut one = config(None);
    one.cores = 1;
    let mut core = ExecutorCore::new(&one, [1; 32]);
    let frames = handshake(&mut core, None);
    let Ok(Message::RegisterExecutor { lanes, .. }) = frames[0].message() else {
        panic!("a RegisterExecutor");
    };
    assert_eq!(lanes, 1);
    deliver(&mut core, &registered, 0);
    assert_eq!(core.lane_key(), None);
}

#[test]
fn cores_beyond_lanes_max_share_the_lanes() {
    let mut many = config(None);
    many.cores = crate::wire::limits::LANES_MAX * 4;
    assert_eq!(many.lanes(), crate::wire::limits::LANES_MAX);
}

#[test]
fn a_lane_joins_with_the_key_then_heartbeats_and_runs_its_launches() {
    let mut core = ExecutorCore::new_lane(&config(None), [1; 32], 1, [7; 32]);
    let frames = handshake(&mut core, None);
    assert_eq!(kinds(&frames), [Kind::JoinLane]);
    let Ok(Message::JoinLane {
        executor_id,
        lane,
        lane_key,
    }) = frames[0].message()
    else {
        panic!("a JoinLane");
    };
    assert_eq!((executor_id, lane, lane_key), ("e1", 1, [7; 32]));
    assert_eq!(core.poll_timeout(), None, "no heartbeat before it joined");
    deliver(
        &mut core,
        &Message::LaneJoined {
            heartbeat_interval_ms: 100,
        },
        1_000,
    );
    assert_eq!(core.poll_timeout(), Some(101_000));
    assert_eq!(core.lane_key(), None, "only lane 0 hands out the key");
    launch(&mut core, &[(1, "echo", b"x")], 2_000);
    assert_eq!(actions(&mut core).len(), 1);
    core.handle_timeout(101_000);
    let frames = sent(&mut core);
    let Ok(Message::Heartbeat { running_tasks, .. }) = frames[0].message() else {
        panic!("a Heartbeat");
    };
    assert_eq!(running_tasks, 1, "what this lane holds");
}

#[test]
fn a_lane_refused_or_answered_as_lane_0_ends_with_typed_errors() {
    let mut core = ExecutorCore::new_lane(&config(None), [1; 32], 1, [7; 32]);
    handshake(&mut core, None);
    let refused = Message::RegisterExecutorFailed {
        reason: "wrong lane key",
    };
    deliver(&mut core, &refused, 0);
    assert_eq!(
        core.poll_exit(),
        Some(Err(ExecutorError::Refused("wrong lane key".into())))
    );

    let mut core = ExecutorCore::new_lane(&config(None), [1; 32], 1, [7; 32]);
    handshake(&mut core, None);
    let registered = Message::RegisteredExecutor {
        heartbeat_interval_ms: 100,
        lane_key: [7; 32],
    };
    deliver(&mut core, &registered, 0);
    assert!(matches!(
        core.poll_exit(),
        Some(Err(ExecutorError::DriverGone(why))) if why.contains("RegisteredExecutor")
    ));

    // Lane 0 is not told it joined.
    let mut core = ExecutorCore::new(&config(None), [1; 32]);
    handshake(&mut core, None);
    deliver(
        &mut core,
        &Message::LaneJoined {
            heartbeat_interval_ms: 100,
        },
        0,
    );
    assert!(matches!(
        core.poll_exit(),
        Some(Err(ExecutorError::DriverGone(_)))
    ));
}

#[test]
fn a_wrong_secret_is_refused_and_the_driver_told_why() {
    let mut core = ExecutorCore::new(&config(Some(Secret::new("a").expect("a"))), [1; 32]);
    let mut to_core = BytesMut::new();
    let wrong = Some(Secret::new("b").expect("b"));
    let mut driver = Handshake::accept(Role::Driver, wrong, [9; 32], DRIVER, &mut to_core);
    for frame in sent(&mut core) {
        driver
            .on_frame(frame.kind(), frame.body(), &mut to_core)
            .expect("the Hello is fine");
    }
    core.handle_bytes(&to_core.split(), 0);
    // The executor proves itself first; the driver checks, refuses and says why.
    for frame in sent(&mut core) {
        let _ = driver.on_frame(frame.kind(), frame.body(), &mut to_core);
    }
    assert!(kinds(&crate::transport::frames_of(&to_core)).contains(&Kind::HandshakeRefused));
    core.handle_bytes(&to_core, 0);
    let exit = core.poll_exit().expect("ended");
    assert!(
        matches!(&exit, Err(ExecutorError::Refused(r)) if r.contains("wrong shared secret")),
        "{exit:?}"
    );
    assert_eq!(actions(&mut core), [Asked::KillAll]);
}

#[test]
fn heartbeats_come_at_the_interval_the_driver_set() {
    let start_us = 1_000;
    let mut core = registered(200, start_us);
    let first_us = start_us + 200_000;
    assert_eq!(core.poll_timeout(), Some(first_us));
    core.handle_timeout(first_us - 1);
    assert!(sent(&mut core).is_empty(), "not due yet");
    for beat in 0..3 {
        let due_us = first_us + beat * 200_000;
        assert_eq!(core.poll_timeout(), Some(due_us));
        core.handle_timeout(due_us);
        let frames = sent(&mut core);
        assert_eq!(kinds(&frames), [Kind::Heartbeat], "beat {beat}");
        let Ok(Message::Heartbeat { executor_id, .. }) = frames[0].message() else {
            panic!("a Heartbeat");
        };
        assert_eq!(executor_id, "e1");
    }
    // Beats missed (a stalled caller) are not made up: one, then one interval on.
    let late_us = first_us + 10 * 200_000 + 7;
    core.handle_timeout(late_us);
    assert_eq!(kinds(&sent(&mut core)), [Kind::Heartbeat]);
    assert_eq!(core.poll_timeout(), Some(late_us + 200_000));
}

#[test]
fn a_heartbeat_interval_out_of_bounds_is_clamped() {
    let core = registered(1, 0);
    assert_eq!(core.poll_timeout(), Some(HEARTBEAT_INTERVAL_MS_MIN * 1000));
    let core = registered(u32::MAX, 0);
    assert_eq!(core.poll_timeout(), Some(HEARTBEAT_INTERVAL_MS_MAX * 1000));
}

#[test]
fn launch_tasks_become_launch_actions_with_their_payloads() {
    let mut core = registered(500, 0);
    launch(&mut core, &[(1, "echo", b"one"), (2, "sleep:5", b"")], 10);
    let expected = [
        launched(1, 0, "echo", Bytes::from_static(b"one")),
        launched(2, 0, "sleep:5", Bytes::new()),
    ];
    assert_eq!(actions(&mut core), expected);
    assert_eq!(core.in_flight(), 2);
    // A duplicate of an attempt in flight is ignored.
    launch(&mut core, &[(1, "echo", b"one")], 20);
    assert!(actions(&mut core).is_empty());
    // The heartbeat counts them as running.
    core.handle_timeout(500_000);
    let frames = sent(&mut core);
    let Ok(Message::Heartbeat { running_tasks, .. }) = frames[0].message() else {
        panic!("a Heartbeat");
    };
    assert_eq!(running_tasks, 2);
}

#[test]
fn a_launch_past_the_in_flight_limit_fails_at_once() {
    let mut core = registered(500, 0);
    // Two cores, two per core.
    let tasks: Vec<(u64, &str, &[u8])> = (0..5).map(|i| (i, "noop", &b""[..])).collect();
    launch(&mut core, &tasks, 10);
    assert_eq!(actions(&mut core).len(), 4);
    let frames = sent(&mut core);
    let Ok(Message::StatusUpdates { updates }) = frames[0].message() else {
        panic!("a StatusUpdates");
    };
    let updates: Vec<StatusUpdateOwned> = updates.iter().map(owned).collect();
    assert_eq!(updates.len(), 1);
    assert_eq!((updates[0].0, updates[0].1), (4, TaskState::Failed));
    assert!(
        updates[0].2.contains("maximum of 4 attempts"),
        "{}",
        updates[0].2
    );
    // A duplicate of an attempt in flight, with no room left: ignored, not failed.
    launch(&mut core, &[(0, "noop", b"")], 11);
    assert!(actions(&mut core).is_empty());
    assert!(sent(&mut core).is_empty(), "nothing reported");
    assert_eq!(core.in_flight(), 4);
}

type StatusUpdateOwned = (u64, TaskState, String);

/// The task and state of every status update in `frames`, in order.
fn states(frames: &[Frame]) -> Vec<(u64, TaskState)> {
    (frames.iter())
        .filter_map(|f| match f.message() {
            Ok(Message::StatusUpdates { updates }) => Some(
                updates
                    .iter()
                    .map(|u| (u.task_id, u.state))
                    .collect::<Vec<_>>(),
            ),
            _ => None,
        })
        .flatten()
        .collect()
}

fn owned(update: wire::StatusUpdate<'_>) -> StatusUpdateOwned {
    (
        update.task_id,
        update.state,
        String::from_utf8_lossy(update.data).into_owned(),
    )
}

/// The driver takes an executor whose heartbeat counts fewer attempts than it must hold
/// for one that does not read: an attempt the count leaves out has its report ahead.
#[test]
fn a_heartbeat_goes_after_the_reports_of_the_attempts_it_no_longer_counts() {
    let mut core = registered(500, 0);
    launch(&mut core, &[(1, "a", b""), (2, "b", b"")], 10);
    actions(&mut core);
    core.handle_completion(done(1, TaskState::Finished, b"r1"), 20);
    core.handle_timeout(500_000);
    let frames = sent(&mut core);
    assert_eq!(kinds(&frames), [Kind::StatusUpdates, Kind::Heartbeat]);
    let Ok(Message::Heartbeat { running_tasks, .. }) = frames[1].message() else {
        panic!("a Heartbeat");
    };
    assert_eq!(running_tasks, 1, "attempt 2 only");
}

#[test]
fn completions_leave_in_one_status_frame_and_an_oversized_result_fails() {
    let mut core = registered(500, 0);
    launch(
        &mut core,
        &[(1, "a", b""), (2, "b", b""), (3, "c", b"")],
        10,
    );
    actions(&mut core);
    let big = vec![b'x'; batch::item_bytes_max(FRAME_SIZE_MAX) + 1];
    core.handle_completion(done(1, TaskState::Running, b""), 20);
    core.handle_completion(done(1, TaskState::Finished, b"r1"), 20);
    core.handle_completion(done(2, TaskState::Finished, &big), 20);
    core.handle_completion(done(3, TaskState::Failed, b"it broke"), 20);
    let frames = sent(&mut core);
    assert_eq!(kinds(&frames), [Kind::StatusUpdates]);
    let Ok(Message::StatusUpdates { updates }) = frames[0].message() else {
        panic!("a StatusUpdates");
    };
    let updates: Vec<StatusUpdateOwned> = updates.iter().map(owned).collect();
    assert_eq!(updates[0], (1, TaskState::Running, String::new()));
    assert_eq!(updates[1], (1, TaskState::Finished, "r1".into()));
    assert_eq!((updates[2].0, updates[2].1), (2, TaskState::Failed));
    assert!(
        updates[2].2.contains("larger than a status frame carries"),
        "{}",
        updates[2].2
    );
    assert_eq!(updates[3], (3, TaskState::Failed, "it broke".into()));
    assert_eq!(core.in_flight(), 0, "final states leave the in-flight set");
    assert!(sent(&mut core).is_empty(), "each completion is sent once");
}

#[test]
fn frames_split_anywhere_are_taken_whole() {
    let mut core = registered(500, 0);
    let tasks = [TaskLaunch {
        task_id: 5,
        attempt: 2,
        cores: 1,
        function: 7,
        payload: b"split",
    }];
    let mut out = BytesMut::new();
    let define = Message::DefineFunction {
        index: 7,
        name: "echo",
    };
    define.encode(&mut out, FRAME_SIZE_MAX).expect("encodes");
    batch::encode_launches(&tasks, &mut out, FRAME_SIZE_MAX).expect("encodes");
    for byte in out.iter() {
        assert!(
            actions(&mut core).is_empty(),
            "nothing before the frame is whole"
        );
        core.handle_bytes(&[*byte], 10);
    }
    assert_eq!(
        actions(&mut core),
        [launched(5, 2, "echo", Bytes::from_static(b"split"))]
    );
}

#[test]
fn a_drain_tells_the_driver_kills_new_launches_and_the_leave_reports_the_rest_killed() {
    let mut core = registered(500, 0);
    launch(&mut core, &[(1, "a", b""), (2, "b", b"")], 10);
    assert_eq!(actions(&mut core).len(), 2);
    sent(&mut core);
    core.handle_drain(20);
    assert_eq!(kinds(&sent(&mut core)), [Kind::ExecutorDraining]);
    core.handle_drain(21);
    assert!(sent(&mut core).is_empty(), "told once");
    // A launch that crossed the message comes back killed; task 1 finishes.
    launch(&mut core, &[(3, "c", b"")], 30);
    assert!(actions(&mut core).is_empty(), "not run");
    core.handle_completion(done(1, TaskState::Finished, b"r"), 40);
    assert_eq!(core.in_flight(), 1);
    assert_eq!(core.handle_leave(50), 1, "task 2 still runs");
    assert_eq!(core.in_flight(), 0);
    assert_eq!(
        states(&sent(&mut core)),
        [
            (3, TaskState::Killed),
            (1, TaskState::Finished),
            (2, TaskState::Killed)
        ]
    );
    // Task 2's late completion is not reported twice.
    core.handle_completion(done(2, TaskState::Finished, b"late"), 60);
    assert!(sent(&mut core).is_empty());
}

#[test]
fn a_batch_of_completions_is_reported_in_order_without_those_reported_killed_at_the_leave() {
    let mut core = registered(500, 0);
    launch(
        &mut core,
        &[(1, "a", b""), (2, "b", b""), (3, "c", b"")],
        10,
    );
    assert_eq!(actions(&mut core).len(), 3);
    sent(&mut core);
    // A batch queued behind one completion already waiting: appended after it.
    core.handle_completion(done(1, TaskState::Finished, b"r1"), 20);
    let mut batch = vec![
        done(2, TaskState::Running, b""),
        done(3, TaskState::Failed, b"it broke"),
    ];
    core.handle_completions(&mut batch, 20);
    assert!(batch.is_empty(), "taken out");
    assert_eq!(core.in_flight(), 1, "task 2 runs on");
    assert_eq!(
        states(&sent(&mut core)),
        [
            (1, TaskState::Finished),
            (2, TaskState::Running),
            (3, TaskState::Failed)
        ]
    );
    // Draining, then leaving: task 2 is reported killed; its completions in a later batch
    // are dropped.
    core.handle_drain(30);
    assert_eq!(core.handle_leave(40), 1);
    sent(&mut core);
    let mut batch = vec![
        done(2, TaskState::Finished, b"late"),
        done(2, TaskState::Finished, b"later"),
    ];
    core.handle_completions(&mut batch, 50);
    assert!(batch.is_empty());
    assert!(states(&sent(&mut core)).is_empty(), "not reported twice");
}

#[test]
fn kill_task_becomes_a_kill_for_an_attempt_in_flight() {
    let mut core = registered(500, 0);
    launch(&mut core, &[(7, "sleep:1000", b"")], 10);
    actions(&mut core);
    for task_id in [7, 8] {
        let kill = Message::KillTask {
            task_id,
            attempt: 0,
            reason: "speculation won",
        };
        deliver(&mut core, &kill, 20);
    }
    assert_eq!(
        actions(&mut core),
        [Asked::Kill(Attempt::new(TaskId(7), 0))],
        "task 8 is not here"
    );
}

#[test]
fn stop_executor_ends_with_what_it_ran() {
    let mut core = registered(500, 0);
    launch(&mut core, &[(1, "a", b""), (2, "b", b"")], 10);
    actions(&mut core);
    core.handle_completion(done(1, TaskState::Finished, b""), 20);
    assert_eq!(core.poll_exit(), None, "still running");
    deliver(&mut core, &Message::StopExecutor {}, 30);
    assert_eq!(
        core.poll_exit(),
        Some(Ok(ExecutorSummary { task_attempts: 1 }))
    );
    assert_eq!(core.poll_exit(), None, "the exit comes once");
    assert_eq!(actions(&mut core), [Asked::KillAll]);
    assert_eq!(core.poll_timeout(), None, "no heartbeat after the end");
    // Nothing more is taken in.
    launch(&mut core, &[(3, "c", b"")], 40);
    core.handle_completion(done(2, TaskState::Killed, b"killed"), 40);
    assert!(actions(&mut core).is_empty());
    assert_eq!(
        kinds(&sent(&mut core)),
        [Kind::StatusUpdates],
        "only task 1"
    );
}

#[test]
fn refusals_and_a_lost_driver_end_with_typed_errors() {
    let mut core = registered(500, 0);
    core.handle_closed("the driver closed the connection");
    assert_eq!(
        core.poll_exit(),
        Some(Err(ExecutorError::DriverGone(
            "the driver closed the connection".into()
        )))
    );

    let mut core = ExecutorCore::new(&config(None), [1; 32]);
    handshake(&mut core, None);
    let refused = Message::RegisterExecutorFailed {
        reason: "duplicate executor id",
    };
    deliver(&mut core, &refused, 0);
    assert_eq!(
        core.poll_exit(),
        Some(Err(ExecutorError::Refused("duplicate executor id".into())))
    );

    // A full driver refuses before its Hello; `run` retries on this reason.
    let mut core = ExecutorCore::new(&config(None), [1; 32]);
    let full = Message::HandshakeRefused {
        reason: crate::conn::TABLE_FULL,
    };
    deliver(&mut core, &full, 0);
    let exit = core.poll_exit();
    assert!(
        matches!(&exit, Some(Err(ExecutorError::Refused(r))) if r.contains(crate::conn::TABLE_FULL)),
        "{exit:?}"
    );

    let mut core = registered(500, 0);
    core.handle_bytes(&[0xff; 16], 0);
    assert!(matches!(
        core.poll_exit(),
        Some(Err(ExecutorError::DriverGone(_)))
    ));
}

#[test]
fn a_launch_naming_an_undefined_function_fails_and_a_define_past_the_table_ends_the_executor() {
    let mut core = registered(500, 0);
    launch(&mut core, &[(1, "echo", b"a")], 10);
    assert_eq!(
        actions(&mut core),
        [launched(1, 0, "echo", Bytes::from_static(b"a"))]
    );
    // Index 1 was never defined: the attempt fails at once, the executor goes on.
    let tasks = [TaskLaunch {
        task_id: 2,
        attempt: 0,
        cores: 1,
        function: 1,
        payload: b"b",
    }];
    let mut out = BytesMut::new();
    batch::encode_launches(&tasks, &mut out, FRAME_SIZE_MAX).expect("encodes");
    core.handle_bytes(&out, 20);
    assert!(actions(&mut core).is_empty(), "nothing to run");
    let frames = sent(&mut core);
    assert_eq!(kinds(&frames), [Kind::StatusUpdates]);
    let Ok(Message::StatusUpdates { updates }) = frames[0].message() else {
        panic!("a StatusUpdates");
    };
    let updates: Vec<_> = (updates.iter()).map(|u| (u.task_id, u.state)).collect();
    assert_eq!(updates, [(2, TaskState::Failed)]);
    assert!(!core.is_ended());
    // Redefined, an index names the new function; one past the table is a protocol error.
    let mut out = BytesMut::new();
    for (index, name) in [(0, "hash"), (FUNCTIONS_PER_CONNECTION, "echo")] {
        let define = Message::DefineFunction { index, name };
        define.encode(&mut out, FRAME_SIZE_MAX).expect("encodes");
    }
    core.handle_bytes(&out, 30);
    assert!(core.is_ended(), "a define past the table ends it");
    // So is a name longer than any job may name.
    let mut core = registered(500, 0);
    let long = "f".repeat(crate::admission::FUNCTION_NAME_MAX_BYTES + 1);
    let mut out = BytesMut::new();
    let define = Message::DefineFunction {
        index: 0,
        name: &long,
    };
    define.encode(&mut out, FRAME_SIZE_MAX).expect("encodes");
    core.handle_bytes(&out, 10);
    assert!(core.is_ended(), "an overlong name ends it");
}
