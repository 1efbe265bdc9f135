//! The core alone: frames built with the wire encoders as a real executor would, time
//! simulated.

use std::time::Instant;

use bytes::Bytes;

use super::health::HEALTH_INTERVAL_US;
use super::*;
use crate::conn::TABLE_FULL;
use crate::driver::{EXECUTOR_CORES_MAX, LANES_MAX};
use crate::handshake::Handshake;
use crate::job::JobOutcome;
use crate::wire::{FrameDecoder, StatusUpdate, TaskState, FRAME_SIZE_MAX_DEFAULT};
use flint_engine::hash::FxHashMap;

const S: u64 = 1_000_000;
const MS: u64 = 1_000;

fn config() -> DriverConfig {
    let mut config = DriverConfig {
        tasks_per_core: 1,
        ..DriverConfig::default()
    };
    config.scheduler.speculation = None;
    config
}

fn new_core(config: DriverConfig) -> DriverCore {
    let telemetry = Box::new(LoopTelemetry::new(Instant::now()));
    DriverCore::new(config, telemetry, [9; 32])
}

fn decode(bytes: &[u8]) -> Vec<Frame> {
    let mut decoder = FrameDecoder::new(FRAME_SIZE_MAX_DEFAULT);
    decoder.extend_from_slice(bytes);
    let mut frames = Vec::new();
    while let Some(frame) = decoder.next_frame().expect("the core sends valid frames") {
        frames.push(frame);
    }
    assert_eq!(decoder.buffered_len(), 0, "a partial frame was transmitted");
    frames
}

/// Everything the core has to send, as frames per peer.
fn transmitted(core: &mut DriverCore) -> Vec<(PeerId, Frame)> {
    let mut out = Vec::new();
    while let Some((peer, bytes)) = core.poll_transmit() {
        out.extend(decode(&bytes).into_iter().map(|frame| (peer, frame)));
    }
    out
}

/// The frames for one peer, decoded (the rest are dropped).
fn sent_to(core: &mut DriverCore, peer: PeerId) -> Vec<Frame> {
    (transmitted(core).into_iter())
        .filter(|(to, _)| *to == peer)
        .map(|(_, frame)| frame)
        .collect()
}

/// Sends one message as `peer`; whether the core keeps the peer.
fn send(core: &mut DriverCore, peer: PeerId, message: &Message<'_>, now_us: u64) -> bool {
    let mut bytes = BytesMut::new();
    message
        .encode(&mut bytes, FRAME_SIZE_MAX_DEFAULT)
        .expect("encodes");
    let mut alive = true;
    for frame in decode(&bytes) {
        alive &= core.handle_frame(peer, &frame, now_us);
    }
    alive
}

/// Connects `peer` and runs an executor's side of the handshake (no secret).
fn connect(core: &mut DriverCore, peer: PeerId, now_us: u64) {
    core.handle_connected(peer, [1; 32], now_us)
        .expect("room for the peer");
    let mut out = BytesMut::new();
    let mut handshake =
        Handshake::connect(Role::Executor, None, [2; 32], &[Role::Driver], &mut out);
    let mut done = false;
    for frame in sent_to(core, peer) {
        done |= handshake
            .on_frame(frame.kind(), frame.body(), &mut out)
            .expect("the driver's handshake is valid")
            .is_some();
    }
    assert!(
        done,
        "the driver's Hello completes an unauthenticated handshake"
    );
    for frame in decode(&out) {
        assert!(core.handle_frame(peer, &frame, now_us), "handshake refused");
    }
}

/// Connects and registers an executor of one lane; the core's answer.
fn register(
    core: &mut DriverCore,
    peer: PeerId,
    executor_id: &str,
    cores: u32,
    now_us: u64,
) -> (bool, Vec<Frame>) {
    register_lanes(core, peer, executor_id, (cores, 1), now_us)
}

/// Connects and registers an executor of `(cores, lanes)` as its lane 0; the answer.
fn register_lanes(
    core: &mut DriverCore,
    peer: PeerId,
    executor_id: &str,
    (cores, lanes): (u32, u32),
    now_us: u64,
) -> (bool, Vec<Frame>) {
    connect(core, peer, now_us);
    let registration = Message::RegisterExecutor {
        executor_id,
        host: "h",
        cores,
        lanes,
        attributes: List::from_items(&[]),
    };
    let alive = send(core, peer, &registration, now_us);
    (alive, sent_to(core, peer))
}

fn refusal(frames: &[Frame]) -> Option<String> {
    frames.iter().find_map(|frame| match frame.message() {
        Ok(Message::RegisterExecutorFailed { reason }) => Some(reason.to_owned()),
        _ => None,
    })
}

fn registered(frames: &[Frame]) -> bool {
    (frames.iter()).any(|f| matches!(f.message(), Ok(Message::RegisteredExecutor { .. })))
}

/// The (task id, attempt) pairs launched in these frames.
fn launches(frames: &[Frame]) -> Vec<(u64, u32)> {
    let mut launched = Vec::new();
    for frame in frames {
        if let Ok(Message::LaunchTasks { tasks }) = frame.message() {
            launched.extend(tasks.iter().map(|t| (t.task_id, t.attempt)));
        }
    }
    launched
}

/// The launches in everything the core has to send, whoever to.
fn launches_to_anyone(core: &mut DriverCore) -> Vec<(u64, u32)> {
    let frames: Vec<Frame> = (transmitted(core).into_iter()).map(|(_, f)| f).collect();
    launches(&frames)
}

/// Submits a job under a fresh id (the caller's side admits jobs), its token the id's low
/// half ([`token_of`]); its id.
fn submit(core: &mut DriverCore, job: Job, now_us: u64) -> JobId {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let id = JobId(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    core.submit(id, token_of(id), job, now_us);
    id
}

/// The token the tests submit job `id` with.
fn token_of(id: JobId) -> JobToken {
    JobToken(id.0 as u32)
}

/// The core's next event, its token checked against its job's.
fn next_event(core: &mut DriverCore) -> Option<Event> {
    let (event, token) = core.poll_event()?;
    let job = match &event {
        Event::TaskResult { task, .. } | Event::OneTaskJobSucceeded { task, .. } => task.job(),
        Event::JobOutcome { job, .. } => *job,
    };
    assert_eq!(token, token_of(job), "{event:?} carries its job's token");
    Some(event)
}

/// Job `id`'s outcome among the events the core has for the callers' side (the others are
/// dropped); fails the test if the job has not ended.
fn outcome(core: &mut DriverCore, id: JobId) -> JobOutcome {
    let mut found = None;
    while let Some(event) = next_event(core) {
        if let Some(Event::JobOutcome { job, outcome }) = event.split().last() {
            if job == id {
                assert!(found.is_none(), "two outcomes for one job");
                found = Some(outcome);
            }
        }
    }
    found.expect("the job has ended")
}

fn finished(task_id: u64, attempt: u32, data: &[u8]) -> Vec<u8> {
    let update = [StatusUpdate {
        task_id,
        attempt,
        state: TaskState::Finished,
        data,
    }];
    let mut out = BytesMut::new();
    batch::encode_status_updates(&update, &mut out, FRAME_SIZE_MAX_DEFAULT).expect("encodes");
    out.to_vec()
}

fn send_bytes(core: &mut DriverCore, peer: PeerId, bytes: &[u8], now_us: u64) -> bool {
    let mut alive = true;
    for frame in decode(bytes) {
        alive &= core.handle_frame(peer, &frame, now_us);
    }
    alive
}

#[test]
fn an_executor_registers_and_a_duplicate_name_is_refused() {
    let mut core = new_core(config());
    let (alive, answer) = register(&mut core, PeerId(1), "e1", 2, 0);
    assert!(alive && registered(&answer), "first registration accepted");
    assert!(core.is_executor(PeerId(1)));
    assert_eq!(core.counts().executors, 1);

    let (alive, answer) = register(&mut core, PeerId(2), "e1", 2, MS);
    assert!(!alive, "the duplicate stays connected");
    let reason = refusal(&answer).expect("a RegisterExecutorFailed");
    assert!(reason.contains("duplicate executor id"), "{reason}");
    let (closed, _) = core.poll_close().expect("the duplicate is closed");
    assert_eq!(closed, PeerId(2));
    assert_eq!(core.counts().executors, 1);
    assert!(core.is_executor(PeerId(1)), "the first is untouched");
}

#[test]
fn a_claim_over_the_core_bound_is_refused_with_the_reason() {
    let mut core = new_core(config());
    let (alive, answer) = register(&mut core, PeerId(1), "liar", EXECUTOR_CORES_MAX + 1, 0);
    assert!(!alive);
    let reason = refusal(&answer).expect("a RegisterExecutorFailed");
    assert!(
        reason.contains(&format!("at most {EXECUTOR_CORES_MAX}")),
        "{reason}"
    );
    assert_eq!(core.poll_close().map(|(p, _)| p), Some(PeerId(1)));
    assert_eq!(core.scheduler.executors(), 0);
    let (alive, answer) = register(&mut core, PeerId(2), "honest", EXECUTOR_CORES_MAX, MS);
    assert!(alive && registered(&answer), "the bound itself is accepted");
}

#[test]
fn a_launched_task_reported_finished_ends_its_job_with_the_result() {
    let mut core = new_core(config());
    let (alive, _) = register(&mut core, PeerId(1), "e1", 1, 0);
    assert!(alive);
    let handle = submit(&mut core, Job::new("echo", vec![Bytes::from("x")]), MS);
    let launched = launches(&sent_to(&mut core, PeerId(1)));
    assert_eq!(launched.len(), 1, "{launched:?}");
    let (task_id, attempt) = launched[0];
    assert!(send_bytes(
        &mut core,
        PeerId(1),
        &finished(task_id, attempt, b"result"),
        2 * MS
    ));
    match outcome(&mut core, handle) {
        JobOutcome::Succeeded(results) => assert_eq!(results, vec![Bytes::from("result")]),
        other => panic!("{other:?}"),
    }
    assert_eq!(core.stats().succeeded, 1);
}

#[test]
fn a_silent_executor_expires_and_its_task_runs_on_another() {
    let mut core = new_core(config());
    assert!(register(&mut core, PeerId(1), "a", 1, 0).0);
    assert!(register(&mut core, PeerId(2), "b", 1, 0).0);
    let handle = submit(&mut core, Job::new("echo", vec![Bytes::from("x")]), MS);
    let sent = transmitted(&mut core);
    let (&(holder, _), launched) = (
        sent.first().expect("a launch"),
        launches(&sent.iter().map(|(_, f)| f.clone()).collect::<Vec<_>>()),
    );
    assert_eq!(launched.len(), 1);
    let other = if holder == PeerId(1) {
        PeerId(2)
    } else {
        PeerId(1)
    };
    let timeout_us = us(core.config.heartbeat_timeout);
    // The other heartbeats; the holder stays silent.
    let heartbeat = Message::Heartbeat {
        executor_id: "other",
        running_tasks: 0,
        metrics: List::from_items(&[]),
    };
    assert!(send(&mut core, other, &heartbeat, timeout_us / 2));
    let _ = transmitted(&mut core);
    core.handle_timeout(timeout_us);
    assert!(
        core.poll_close().is_none(),
        "expired at exactly the timeout"
    );
    let at_us = core.poll_timeout().expect("a heartbeat deadline");
    assert_eq!(
        at_us,
        timeout_us + 1,
        "the holder's expiry is the next deadline"
    );
    core.handle_timeout(at_us);
    let (closed, why) = core.poll_close().expect("the silent one is closed");
    assert_eq!(closed, holder);
    assert!(why.to_string().contains("no heartbeat"), "{why}");
    assert!(core.poll_close().is_none(), "the other stays");
    let relaunched = launches(&sent_to(&mut core, other));
    assert_eq!(
        relaunched,
        vec![(launched[0].0, 1)],
        "the task runs again elsewhere"
    );
    assert!(send_bytes(
        &mut core,
        other,
        &finished(launched[0].0, 1, b"again"),
        at_us + MS
    ));
    assert!(matches!(
        outcome(&mut core, handle),
        JobOutcome::Succeeded(_)
    ));
    assert_eq!(core.counts().executors_lost, 1);
}

/// The lane key in a `RegisteredExecutor` answer.
fn lane_key(frames: &[Frame]) -> [u8; 32] {
    frames
        .iter()
        .find_map(|frame| match frame.message() {
            Ok(Message::RegisteredExecutor { lane_key, .. }) => Some(lane_key),
            _ => None,
        })
        .expect("a RegisteredExecutor")
}

/// Connects `peer` and asks to join `executor_id` as `lane` with `key`; whether the core
/// keeps the peer, and its answer.
fn join(
    core: &mut DriverCore,
    peer: PeerId,
    (executor_id, lane, lane_key): (&str, u32, [u8; 32]),
    now_us: u64,
) -> (bool, Vec<Frame>) {
    connect(core, peer, now_us);
    let join = Message::JoinLane {
        executor_id,
        lane,
        lane_key,
    };
    let alive = send(core, peer, &join, now_us);
    (alive, sent_to(core, peer))
}

fn joined(frames: &[Frame]) -> bool {
    (frames.iter()).any(|f| matches!(f.message(), Ok(Message::LaneJoined { .. })))
}

/// Executor `e` of 2 cores on 2 lanes, both joined (lane 0 on peer 1, lane 1 on peer 2).
fn two_lanes(core: &mut DriverCore, now_us: u64) {
    let (alive, answer) = register_lanes(core, PeerId(1), "e", (2, 2), now_us);
    assert!(alive && registered(&answer));
    let (alive, answer) = join(core, PeerId(2), ("e", 1, lane_key(&answer)), now_us);
    assert!(alive && joined(&answer), "lane 1 joins with the key");
}

/// The launches each peer was sent.
fn launches_by_peer(core: &mut DriverCore) -> FxHashMap<PeerId, Vec<(u64, u32)>> {
    let mut by_peer: FxHashMap<PeerId, Vec<(u64, u32)>> = FxHashMap::default();
    for (peer, frame) in transmitted(core) {
        let launched = launches(std::slice::from_ref(&frame));
        if !launched.is_empty() {
            by_peer.entry(peer).or_default().extend(launched);
        }
    }
    by_peer
}

#[test]
fn a_lane_joins_with_the_key_and_gets_launches_once_joined() {
    let mut core = new_core(config());
    let (alive, answer) = register_lanes(&mut core, PeerId(1), "e", (2, 2), 0);
    assert!(alive && registered(&answer));
    let key = lane_key(&answer);
    assert_ne!(key, [0; 32], "a random key for an executor of lanes");
    // Launches start with lane 0 alone.
    let _first = submit(&mut core, Job::new("echo", vec![Bytes::from("1")]), MS);
    let sent = launches_by_peer(&mut core);
    assert_eq!(sent.keys().copied().collect::<Vec<_>>(), [PeerId(1)]);
    let (alive, answer) = join(&mut core, PeerId(2), ("e", 1, key), 2 * MS);
    assert!(alive && joined(&answer), "lane 1 joins");
    assert!(core.is_executor(PeerId(2)));
    // The scheduler sees one executor of 2 cores; the next launch goes to lane 1, which
    // holds fewer.
    assert_eq!(core.scheduler.executors(), 1);
    assert_eq!(core.executors_view().executors.len(), 1);
    let second = submit(&mut core, Job::new("echo", vec![Bytes::from("2")]), 3 * MS);
    let sent = launches_by_peer(&mut core);
    let on_lane1 = sent.get(&PeerId(2)).expect("lane 1 got the launch").clone();
    assert_eq!((sent.len(), on_lane1.len()), (1, 1), "{sent:?}");
    let view = core.observe(4 * MS);
    assert_eq!(view.executors[0].lane_launches, [1, 1]);
    assert_eq!(view.executors[0].lanes_joined, 2);
    // A report is taken from any lane of the executor (here lane 0, for lane 1's attempt).
    let (task_id, attempt) = on_lane1[0];
    assert!(send_bytes(
        &mut core,
        PeerId(1),
        &finished(task_id, attempt, b"two"),
        5 * MS
    ));
    match outcome(&mut core, second) {
        JobOutcome::Succeeded(results) => assert_eq!(results, vec![Bytes::from("two")]),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_kill_goes_to_the_lane_that_holds_the_attempt() {
    let mut core = new_core(config());
    two_lanes(&mut core, 0);
    let a = submit(&mut core, Job::new("sleep", vec![Bytes::new()]), MS);
    let b = submit(&mut core, Job::new("sleep", vec![Bytes::new()]), MS);
    let sent = launches_by_peer(&mut core);
    assert_eq!(sent.len(), 2, "one attempt on each lane: {sent:?}");
    let holder_of = |job: u64| {
        (sent.iter())
            .find(|(_, launched)| launched.iter().any(|(t, _)| t >> 32 == job))
            .map(|(peer, _)| *peer)
            .expect("launched")
    };
    let (holder, other) = (holder_of(b.0), holder_of(a.0));
    core.cancel(b, 2 * MS);
    let kills: Vec<PeerId> = (transmitted(&mut core).into_iter())
        .filter(|(_, f)| matches!(f.message(), Ok(Message::KillTask { .. })))
        .map(|(peer, _)| peer)
        .collect();
    assert_eq!(kills, [holder], "not to {other:?}");
    assert!(matches!(outcome(&mut core, b), JobOutcome::Cancelled));
}

#[test]
fn a_lane_is_refused_for_a_wrong_key_an_unknown_executor_or_a_lane_out_of_range_or_taken() {
    let mut core = new_core(config());
    let (_, answer) = register_lanes(&mut core, PeerId(1), "e", (3, 3), 0);
    let key = lane_key(&answer);
    let (alive, _) = join(&mut core, PeerId(2), ("e", 1, key), 0);
    assert!(alive);
    let mut wrong = key;
    wrong[31] ^= 1;
    let cases = [
        (("e", 2, wrong), "wrong lane key"),
        (("x", 2, key), "no executor \"x\""),
        (("e", 3, key), "lane 3 out of range"),
        (("e", 0, key), "lane 0 out of range"),
        (("e", 1, key), "lane 1 has joined already"),
    ];
    for (peer, (ask, expected)) in (10..).map(PeerId).zip(cases) {
        let (alive, answer) = join(&mut core, peer, ask, MS);
        assert!(!alive, "{ask:?} refused");
        let reason = refusal(&answer).expect("a RegisterExecutorFailed");
        assert!(reason.contains(expected), "{reason}");
        assert_eq!(core.poll_close().map(|(p, _)| p), Some(peer));
    }
    // None of it touched the executor: lane 2 still joins.
    assert!(core.is_executor(PeerId(1)) && core.is_executor(PeerId(2)));
    let (alive, answer) = join(&mut core, PeerId(3), ("e", 2, key), 2 * MS);
    assert!(alive && joined(&answer));
    // An executor of one lane has none to join, whatever key is shown.
    let (_, answer) = register(&mut core, PeerId(4), "solo", 2, 3 * MS);
    let (alive, _) = join(&mut core, PeerId(5), ("solo", 1, lane_key(&answer)), 3 * MS);
    assert!(!alive, "no lane of a one-lane executor joins");
}

#[test]
fn a_registration_claiming_lanes_out_of_bounds_is_refused() {
    let mut core = new_core(config());
    for (peer, lanes, cores) in [(1, 0, 2), (2, 3, 2), (3, LANES_MAX + 1, 64)] {
        let (alive, answer) = register_lanes(&mut core, PeerId(peer), "e", (cores, lanes), 0);
        assert!(!alive, "{lanes} lanes of {cores} cores");
        let reason = refusal(&answer).expect("a RegisterExecutorFailed");
        assert!(
            reason.contains(&format!("claims {lanes} lanes")),
            "{reason}"
        );
    }
    let (alive, answer) = register_lanes(&mut core, PeerId(4), "e", (64, LANES_MAX), 0);
    assert!(alive && registered(&answer), "the bound itself is accepted");
}

#[test]
fn a_lane_lost_loses_the_executor_and_its_attempts_run_elsewhere() {
    let mut core = new_core(config());
    two_lanes(&mut core, 0);
    let handle = submit(
        &mut core,
        Job::new("echo", vec![Bytes::from("a"), Bytes::from("b")]),
        MS,
    );
    let sent = launches_by_peer(&mut core);
    assert_eq!(sent.len(), 2, "one attempt on each lane: {sent:?}");
    core.handle_closed(PeerId(2), &ConnError::Closed, 2 * MS);
    let (closed, why) = core.poll_close().expect("lane 0 is closed with it");
    assert_eq!(closed, PeerId(1));
    assert!(why.to_string().contains("lane 1: peer closed"), "{why}");
    assert_eq!(core.scheduler.executors(), 0);
    assert_eq!(core.counts().executors_lost, 1);
    let view = core.observe(3 * MS);
    assert!(view.executors[0].removed.contains("lane 1"), "{view:?}");
    // Both attempts run again on another executor.
    let (alive, answer) = register(&mut core, PeerId(3), "b", 2, 3 * MS);
    assert!(alive);
    let relaunched = launches(&answer);
    assert_eq!(relaunched.len(), 2, "{relaunched:?}");
    for (task_id, attempt) in relaunched {
        assert_eq!(attempt, 1);
        let bytes = finished(task_id, attempt, b"again");
        assert!(send_bytes(&mut core, PeerId(3), &bytes, 4 * MS));
    }
    assert!(matches!(
        outcome(&mut core, handle),
        JobOutcome::Succeeded(_)
    ));
}

#[test]
fn a_deaf_lane_is_lost_while_its_honest_sibling_counts_only_its_own() {
    let mut core = new_core(config());
    let timeout_us = us(core.config.heartbeat_timeout);
    let beat_us = timeout_us / 4;
    two_lanes(&mut core, 0);
    let _handle = submit(
        &mut core,
        Job::new("echo", vec![Bytes::from("a"), Bytes::from("b")]),
        MS,
    );
    let sent = launches_by_peer(&mut core);
    assert_eq!(sent.len(), 2, "one attempt on each lane: {sent:?}");
    // Lane 0 reads its launch and counts it (one, not both); lane 1 counts nothing.
    let mut now_us = MS;
    while now_us < MS + timeout_us + beat_us {
        now_us += beat_us;
        assert!(
            heartbeat(&mut core, PeerId(1), 1, now_us),
            "lane 0 kept at {now_us}"
        );
        let alive = heartbeat(&mut core, PeerId(2), 0, now_us);
        if !alive {
            break;
        }
    }
    assert!(now_us > MS + timeout_us, "not before its launch is old");
    let closed: FxHashMap<PeerId, String> = std::iter::from_fn(|| core.poll_close())
        .map(|(peer, why)| (peer, why.to_string()))
        .collect();
    assert_eq!(closed.len(), 2, "both lanes close: {closed:?}");
    let why = &closed[&PeerId(2)];
    assert!(why.contains("does not read its launches"), "{why}");
    let why = &closed[&PeerId(1)];
    assert!(
        why.contains("its executor is lost: lane 1: executor does not read"),
        "{why}"
    );
    assert_eq!(core.counts().executors_lost, 1);
}

/// A heartbeat from `peer` counting `running_tasks`; whether the core keeps the peer.
fn heartbeat(core: &mut DriverCore, peer: PeerId, running_tasks: u32, now_us: u64) -> bool {
    let heartbeat = Message::Heartbeat {
        executor_id: "any",
        running_tasks,
        metrics: List::from_items(&[]),
    };
    send(core, peer, &heartbeat, now_us)
}

/// Two executors of one core and a one-task job: the holder of its attempt 0, the other
/// and the task id.
fn one_task_on_two(core: &mut DriverCore, now_us: u64) -> (JobId, PeerId, PeerId, u64) {
    assert!(register(core, PeerId(1), "a", 1, now_us).0);
    assert!(register(core, PeerId(2), "b", 1, now_us).0);
    let handle = submit(core, Job::new("echo", vec![Bytes::from("x")]), now_us);
    let sent = transmitted(core);
    let frames: Vec<Frame> = sent.iter().map(|(_, f)| f.clone()).collect();
    let launched = launches(&frames);
    assert_eq!(launched.len(), 1, "{launched:?}");
    let holder = sent
        .iter()
        .find(|(_, f)| f.kind() == wire::Kind::LaunchTasks as u16)
        .map(|(peer, _)| *peer)
        .expect("a launch");
    let other = if holder == PeerId(1) {
        PeerId(2)
    } else {
        PeerId(1)
    };
    (handle, holder, other, launched[0].0)
}

#[test]
fn an_executor_that_does_not_read_its_launches_is_lost_and_its_task_runs_elsewhere() {
    let mut core = new_core(config());
    let timeout_us = us(core.config.heartbeat_timeout);
    let beat_us = timeout_us / 4;
    let (handle, deaf, other, task_id) = one_task_on_two(&mut core, MS);
    // Heartbeats counting nothing while the launch may still be on its way are no sign.
    let mut now_us = MS;
    while now_us + beat_us < MS + timeout_us {
        now_us += beat_us;
        assert!(heartbeat(&mut core, deaf, 0, now_us), "kept at {now_us} us");
        assert!(heartbeat(&mut core, other, 0, now_us));
    }
    // Past the timeout: one heartbeat short is a suspicion, the second in a row a loss.
    now_us = MS + timeout_us;
    assert!(heartbeat(&mut core, deaf, 0, now_us), "one short heartbeat");
    assert!(heartbeat(&mut core, other, 0, now_us));
    let _ = transmitted(&mut core);
    now_us += beat_us;
    assert!(
        !heartbeat(&mut core, deaf, 0, now_us),
        "the second removes it"
    );
    let (closed, why) = core.poll_close().expect("the deaf one is closed");
    assert_eq!(closed, deaf);
    let timeout_s = core.config.heartbeat_timeout.as_secs_f64();
    let reason = format!(
        "executor does not read its launches: 1 attempts sent over {timeout_s} s ago, it \
         reports 0 running"
    );
    assert!(why.to_string().starts_with(&reason), "{why}");
    assert_eq!(core.counts().executors_lost, 1);
    assert_eq!(
        launches(&sent_to(&mut core, other)),
        vec![(task_id, 1)],
        "the task runs again elsewhere"
    );
    assert!(send_bytes(
        &mut core,
        other,
        &finished(task_id, 1, b"again"),
        now_us + MS
    ));
    assert!(matches!(
        outcome(&mut core, handle),
        JobOutcome::Succeeded(_)
    ));
}

#[test]
fn a_burst_that_took_long_to_build_launches_attempts_stamped_when_they_leave() {
    let mut core = new_core(config());
    assert!(register(&mut core, PeerId(1), "a", 1, MS).0);
    assert!(register(&mut core, PeerId(2), "b", 1, MS).0);
    let _ = transmitted(&mut core);
    // Its build takes a second (a job of millions of tasks): more than the hedging
    // threshold (200 ms while the function has no run times yet).
    let job = JobId(1);
    core.submit_burst(2 * MS, |burst| {
        burst.submit(
            job,
            token_of(job),
            Job::new("echo", vec![Bytes::from("x"); 2]),
        );
        burst.advance(S + 2 * MS);
    });
    let launched = launches_to_anyone(&mut core);
    assert_eq!(launched.len(), 2, "{launched:?}");
    // Just after: nothing is overdue, so nothing is copied and no executor is suspected.
    for peer in [PeerId(1), PeerId(2)] {
        assert!(heartbeat(&mut core, peer, 1, S + 3 * MS));
    }
    core.handle_timeout(S + 10 * MS);
    assert_eq!(launches_to_anyone(&mut core), vec![], "copied at once");
    let health = core.executor_health();
    assert!(health.stalled.is_empty(), "{health:?}");
    assert!(health.suspected.is_empty(), "{health:?}");
}

#[test]
fn an_executor_that_reads_its_launches_and_runs_them_late_is_kept() {
    let mut core = new_core(config());
    let timeout_us = us(core.config.heartbeat_timeout);
    let beat_us = timeout_us / 4;
    let (handle, slow, other, task_id) = one_task_on_two(&mut core, MS);
    // It counts the attempt from its first heartbeat on, and reports it RUNNING only after
    // three timeouts, then finishes it.
    let mut now_us = MS;
    while now_us < 3 * timeout_us {
        now_us += beat_us;
        assert!(heartbeat(&mut core, slow, 1, now_us), "kept at {now_us} us");
        assert!(heartbeat(&mut core, other, 0, now_us));
    }
    let running = [StatusUpdate {
        task_id,
        attempt: 0,
        state: TaskState::Running,
        data: b"",
    }];
    let mut out = BytesMut::new();
    batch::encode_status_updates(&running, &mut out, FRAME_SIZE_MAX_DEFAULT).expect("encodes");
    assert!(send_bytes(&mut core, slow, &out, now_us));
    for _ in 0..8 {
        now_us += beat_us;
        assert!(heartbeat(&mut core, slow, 1, now_us), "kept at {now_us} us");
        assert!(heartbeat(&mut core, other, 0, now_us));
    }
    // Its final report goes ahead of the heartbeat that no longer counts the attempt.
    assert!(send_bytes(
        &mut core,
        slow,
        &finished(task_id, 0, b"late"),
        now_us
    ));
    for _ in 0..8 {
        now_us += beat_us;
        assert!(heartbeat(&mut core, slow, 0, now_us), "kept at {now_us} us");
    }
    assert!(core.poll_close().is_none(), "nobody is closed");
    assert_eq!(core.counts().executors_lost, 0);
    assert!(matches!(outcome(&mut core, handle), JobOutcome::Succeeded(ref r) if r[0] == "late"));
}

#[test]
fn poll_timeout_is_none_when_idle_and_the_earliest_deadline_otherwise() {
    let config = config();
    let handshake_us = us(config.handshake_timeout);
    let heartbeat_us = us(config.heartbeat_timeout);
    let mut core = new_core(config);
    assert_eq!(core.poll_timeout(), None, "a new driver");
    core.handle_connected(PeerId(1), [1; 32], 0).expect("room");
    assert_eq!(
        core.poll_timeout(),
        Some(handshake_us + 1),
        "the handshake's"
    );
    core.handle_closed(PeerId(1), &ConnError::Closed, MS);
    core.handle_timeout(handshake_us + 1);
    assert_eq!(core.poll_timeout(), None, "the peer went");

    assert!(register(&mut core, PeerId(2), "e", 1, 10 * S).0);
    assert_eq!(
        core.poll_timeout(),
        Some(10 * S + heartbeat_us + 1),
        "its heartbeat's"
    );
    // A job that cannot start (it needs two cores): its deadline and the stall check.
    let mut job = Job::new("echo", vec![Bytes::new()]).deadline(Duration::from_millis(150));
    job.cores = 2;
    let handle = submit(&mut core, job, 11 * S);
    assert_eq!(
        core.poll_timeout(),
        Some(11 * S + HEALTH_INTERVAL_US),
        "the first stall check, before the job's deadline"
    );
    core.handle_timeout(11 * S + HEALTH_INTERVAL_US);
    assert_eq!(
        core.poll_timeout(),
        Some(11 * S + 150 * MS),
        "the job's deadline"
    );
    core.handle_timeout(11 * S + 150 * MS);
    assert!(matches!(outcome(&mut core, handle), JobOutcome::Failed(_)));
    assert_eq!(
        core.poll_timeout(),
        Some(10 * S + heartbeat_us + 1),
        "only the executor's heartbeat once the job ended"
    );
}

#[test]
fn a_job_past_its_deadline_fails_with_that_reason() {
    let mut core = new_core(config());
    // No executor: the task waits.
    let job = Job::new("echo", vec![Bytes::new()]).deadline(Duration::from_secs(2));
    let handle = submit(&mut core, job, 0);
    core.handle_timeout(S);
    assert!(
        core.scheduler.active_jobs() > 0,
        "still within its deadline"
    );
    core.handle_timeout(2 * S);
    match outcome(&mut core, handle) {
        JobOutcome::Failed(reasons) => assert!(
            reasons.iter().any(|r| r.contains("its deadline passed")),
            "{reasons:?}"
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(core.scheduler.active_jobs(), 0);
}

#[test]
fn a_full_table_evicts_the_oldest_handshake_and_then_refuses() {
    let mut core = new_core(DriverConfig {
        connections_max: 3,
        ..config()
    });
    assert!(register(&mut core, PeerId(0), "e", 1, 0).0);
    core.handle_connected(PeerId(1), [1; 32], MS).expect("room");
    core.handle_connected(PeerId(2), [1; 32], 2 * MS)
        .expect("room");
    let _ = transmitted(&mut core);
    // Full: the oldest unauthenticated connection makes room, told why.
    core.handle_connected(PeerId(3), [1; 32], 3 * MS)
        .expect("room made");
    let told = sent_to(&mut core, PeerId(1));
    assert!(
        told.iter().any(|f| matches!(
            f.message(),
            Ok(Message::HandshakeRefused { reason }) if reason.starts_with(TABLE_FULL)
        )),
        "the evicted peer hears the table is full"
    );
    assert_eq!(core.poll_close().map(|(p, _)| p), Some(PeerId(1)));
    assert!(core.poll_close().is_none());
    // Only executors left to evict: refused, the executor kept.
    core.handle_closed(PeerId(2), &ConnError::Closed, 4 * MS);
    core.handle_closed(PeerId(3), &ConnError::Closed, 4 * MS);
    assert!(register(&mut core, PeerId(5), "f", 1, 4 * MS).0);
    assert!(register(&mut core, PeerId(6), "g", 1, 4 * MS).0);
    let refused = core.handle_connected(PeerId(4), [1; 32], 5 * MS);
    assert!(refused.is_err_and(|reason| reason.starts_with(TABLE_FULL)));
    assert!(core.poll_close().is_none(), "no executor is evicted");
    assert_eq!(core.counts().executors, 3);
}

#[test]
fn the_local_executor_gets_launches_and_its_completions_end_the_job() {
    let mut core = new_core(config());
    assert_eq!(core.add_local_executor(2, 0), 2, "two cores of one slot");
    let handle = submit(&mut core, Job::new("echo", vec![Bytes::from("a"); 2]), MS);
    let mut completions = Vec::new();
    while let Some(command) = core.poll_local() {
        let LocalCommand::Launch(task) = command else {
            panic!("only launches: {command:?}");
        };
        completions.push(TaskReport {
            task: task.task,
            attempt: task.attempt,
            state: TaskState::Finished,
            data: task.payload,
        });
    }
    assert_eq!(completions.len(), 2);
    assert!(core.poll_transmit().is_none(), "nothing goes over the wire");
    core.handle_local_completions(&mut completions, 2 * MS);
    assert!(completions.is_empty(), "drained");
    match outcome(&mut core, handle) {
        JobOutcome::Succeeded(results) => assert_eq!(results, vec![Bytes::from("a"); 2]),
        other => panic!("{other:?}"),
    }
}

/// A launch names its function by an index its connection defined: one `DefineFunction` per
/// name, ahead of the launches using it; past `FUNCTIONS_PER_CONNECTION` names in one batch,
/// the launches under an index's old name go out before it is defined anew.
#[test]
fn launches_name_functions_by_index_defined_ahead_even_past_the_table() {
    use crate::wire::limits::FUNCTIONS_PER_CONNECTION;
    let jobs = FUNCTIONS_PER_CONNECTION as usize + 44;
    let mut config = config();
    config.scheduler.slow_start_slots = jobs as u32 + 1;
    let mut core = new_core(config);
    // Queued before any executor: the registration's one offer round launches them all, in
    // one batch of as many functions.
    let mut function_of = FxHashMap::default();
    for i in 0..jobs {
        let name = format!("f{i}");
        let id = submit(
            &mut core,
            Job::new(name.as_str(), vec![Bytes::from("x")]),
            MS,
        );
        function_of.insert(id.0, name);
    }
    // One core more than the jobs, for the last launch below.
    let (alive, frames) = register(&mut core, PeerId(1), "e1", jobs as u32 + 1, 2 * MS);
    assert!(alive && registered(&frames));
    let mut defined: FxHashMap<u32, String> = FxHashMap::default();
    let (mut defines, mut launched) = (0, 0);
    for frame in &frames {
        match frame.message() {
            Ok(Message::DefineFunction { index, name }) => {
                assert!(index < FUNCTIONS_PER_CONNECTION);
                defined.insert(index, name.to_owned());
                defines += 1;
            }
            Ok(Message::LaunchTasks { tasks }) => {
                for task in tasks {
                    let name = defined.get(&task.function).expect("defined ahead");
                    assert_eq!(Some(name), function_of.get(&(task.task_id >> 32)));
                    launched += 1;
                }
            }
            _ => {}
        }
    }
    assert_eq!((defines, launched), (jobs, jobs));
    // A name defined lately needs no new definition.
    let last = format!("f{}", jobs - 1);
    submit(
        &mut core,
        Job::new(last.as_str(), vec![Bytes::from("y")]),
        3 * MS,
    );
    let frames = sent_to(&mut core, PeerId(1));
    let kinds: Vec<u16> = frames.iter().map(Frame::kind).collect();
    assert_eq!(kinds, [wire::Kind::LaunchTasks as u16]);
}

/// Every job and task event the core has for the callers' side: the outcomes by job.
fn outcomes(core: &mut DriverCore) -> FxHashMap<JobId, JobOutcome> {
    let mut found = FxHashMap::default();
    while let Some(event) = next_event(core) {
        if let Some(Event::JobOutcome { job, outcome }) = event.split().last() {
            assert!(
                found.insert(job, outcome).is_none(),
                "two outcomes for one job"
            );
        }
    }
    found
}

#[test]
fn jobs_with_and_without_settings_are_filed_as_asked_and_malformed_ones_refused() {
    let mut core = new_core(config());
    let (alive, _) = register(&mut core, PeerId(1), "e1", 2, 0);
    assert!(alive);
    // No settings of its own (the common job, its spec built in place), and one with a pool.
    let plain = Job::new("f", vec![Bytes::from("x")]).keep_results(false);
    let plain = submit(&mut core, plain, MS);
    let pooled = Job::new("g", vec![Bytes::from("y")]).pool("p");
    let pooled = submit(&mut core, pooled, MS);
    let view = core.observe(2 * MS);
    let shown = |id: JobId| {
        let job = view.jobs.iter().find(|j| j.id == id.0)?;
        Some((job.function.to_string(), job.pool.to_string(), job.tasks))
    };
    assert_eq!(shown(plain), Some(("f".into(), "default".into(), 1)));
    assert_eq!(shown(pooled), Some(("g".into(), "p".into(), 1)));
    for (task, attempt) in launches(&sent_to(&mut core, PeerId(1))) {
        let result = format!("r{task}");
        let update = finished(task, attempt, result.as_bytes());
        assert!(send_bytes(&mut core, PeerId(1), &update, 3 * MS));
    }
    let mut ended = outcomes(&mut core);
    assert_eq!(
        ended.remove(&plain),
        Some(JobOutcome::Succeeded(Vec::new())),
        "results not kept"
    );
    let kept = Bytes::from(format!("r{}", TaskId::new(pooled, 0).0));
    assert_eq!(
        ended.remove(&pooled),
        Some(JobOutcome::Succeeded(vec![kept]))
    );
    // Refused by the job's own settings (more preferences than tasks), then by the scheduler.
    let misplaced = Job::new("f", vec![Bytes::from("x")])
        .locality(vec![crate::job::TaskLocality::default(); 2]);
    let misplaced = submit(&mut core, misplaced, 4 * MS);
    let coreless = submit(
        &mut core,
        Job::new("f", vec![Bytes::from("x")]).cores(0),
        4 * MS,
    );
    let mut ended = outcomes(&mut core);
    let reasons = |outcome: Option<JobOutcome>| match outcome {
        Some(JobOutcome::Failed(reasons)) => reasons,
        other => panic!("not refused: {other:?}"),
    };
    assert_eq!(
        reasons(ended.remove(&misplaced)),
        ["job refused: 2 locality entries for 1 tasks"]
    );
    assert_eq!(
        reasons(ended.remove(&coreless)),
        ["job refused: task 0 asks for zero cores"]
    );
    assert!(
        launches_to_anyone(&mut core).is_empty(),
        "nothing refused ran"
    );
}
