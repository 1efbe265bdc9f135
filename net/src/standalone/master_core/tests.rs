use flint_engine::standalone::{self as sa, AppSpec};

use std::time::Duration;

use super::*;
use crate::conn::Inbound;
use crate::handshake::Handshake;
use crate::transport::peers::Limits;
use crate::wire::{Kind, FRAME_SIZE_MAX_DEFAULT};

const WORKER: Token = Token(1);
const APP: Token = Token(2);
const OTHER: Token = Token(3);
const S: u64 = 1_000_000;

fn core() -> MasterCore {
    let master = Master::new(sa::Config::default(), "app-test");
    MasterCore::new(
        master,
        CoreConfig {
            heartbeat_interval_ms: 1000,
            apps_connections_max: 2,
            frame_size_max: FRAME_SIZE_MAX_DEFAULT,
            tick_period_us: 250_000,
            peers: PeersConfig {
                inbound: Inbound {
                    role: Role::Master,
                    accepted_roles: &[Role::Worker, Role::Driver, Role::Client],
                    secret: None,
                    frame_size_max: FRAME_SIZE_MAX_DEFAULT,
                    outbound_max: 1 << 20,
                },
                name: "the master",
                limits: Limits {
                    connections_max: 16,
                    handshakes_max: 16,
                    clients_max: 16,
                    handshake_timeout: Duration::from_secs(30),
                    client_idle_timeout: Duration::from_secs(30),
                    member_timeout: None,
                },
            },
        },
    )
}

/// Connects `peer` and plays its side of the handshake as `role`; whether the core opened
/// it (what it sent meanwhile is dropped, unless it refused).
fn open(core: &mut MasterCore, peer: Token, role: Role) -> bool {
    core.handle_connected(peer, [1; 32], 0).expect("room");
    let mut out = BytesMut::new();
    let mut ours = Handshake::connect(role, None, [2; 32], &[Role::Master], &mut out);
    for frame in sent_to(core, peer) {
        ours.on_frame(frame.kind(), frame.body(), &mut out)
            .expect("the master's Hello is valid");
    }
    for frame in frames(&out) {
        let _ = core.handle_frame(peer, &frame, 0);
    }
    core.phase(peer).is_some()
}

/// The frames the core wants sent to `peer` (the rest are dropped).
fn sent_to(core: &mut MasterCore, peer: Token) -> Vec<Frame> {
    (sent(core).into_iter())
        .filter(|(to, _)| *to == peer)
        .map(|(_, frame)| frame)
        .collect()
}

fn frames(bytes: &[u8]) -> Vec<Frame> {
    crate::transport::frames_of(bytes)
}

fn frame(message: &Message<'_>) -> Frame {
    let mut out = BytesMut::new();
    message
        .encode(&mut out, FRAME_SIZE_MAX_DEFAULT)
        .expect("encodes");
    frames(&out).pop().expect("one frame")
}

/// Every frame the core wants sent, with its peer.
fn sent(core: &mut MasterCore) -> Vec<(Token, Frame)> {
    let mut all = Vec::new();
    while let Some((peer, bytes)) = core.poll_transmit() {
        all.extend(frames(&bytes).into_iter().map(|f| (peer, f)));
    }
    all
}

fn kinds(sent: &[(Token, Frame)]) -> Vec<(Token, u16)> {
    sent.iter().map(|(peer, f)| (*peer, f.kind())).collect()
}

fn register_worker(
    core: &mut MasterCore,
    peer: Token,
    id: &str,
    now_us: u64,
) -> Result<(), ConnError> {
    assert!(open(core, peer, Role::Worker), "opens");
    let register = Message::RegisterWorker {
        worker_id: id,
        host: "127.0.0.1",
        port: 0,
        cores: 4,
        memory_mb: 4096,
    };
    core.handle_frame(peer, &frame(&register), now_us)
}

/// Registers an application on `APP`: its id and everything sent meanwhile.
fn register_app(core: &mut MasterCore, now_us: u64) -> (String, Vec<(Token, Frame)>) {
    assert!(open(core, APP, Role::Driver), "opens");
    let spec = AppSpec {
        name: "job".into(),
        driver_addr: "127.0.0.1:1".into(),
        cores_per_executor: 1,
        memory_mb: 512,
        ..AppSpec::default()
    };
    let register = with_description(&spec, |app| frame(&Message::RegisterApplication { app }));
    core.handle_frame(APP, &register, now_us)
        .expect("registers");
    let answers = sent(core);
    let (peer, answer) = answers
        .iter()
        .find(|(_, f)| f.kind() == Kind::RegisteredApplication as u16)
        .expect("an answer");
    assert_eq!(*peer, APP);
    let Ok(Message::RegisteredApplication { app_id }) = answer.message() else {
        panic!("not a registration answer");
    };
    (app_id.to_owned(), answers)
}

#[test]
fn a_worker_registers_is_journaled_and_its_heartbeats_are_acked() {
    let mut core = core();
    register_worker(&mut core, WORKER, "w1", 0).expect("registers");
    assert_eq!(core.phase(WORKER), Some(&Phase::Worker("w1".into())));
    assert_eq!(core.standing(WORKER), Standing::Member);
    let answer = sent(&mut core);
    assert_eq!(kinds(&answer), [(WORKER, Kind::RegisteredWorker as u16)]);
    assert!(matches!(
        answer[0].1.message(),
        Ok(Message::RegisteredWorker {
            heartbeat_interval_ms: 1000
        })
    ));
    assert!(matches!(
        core.poll_record(),
        Some(Record::WorkerRegistered(spec)) if spec.id == "w1" && spec.cores == 4
    ));
    let heartbeat = frame(&Message::WorkerHeartbeat { worker_id: "w1" });
    core.handle_frame(WORKER, &heartbeat, S).expect("alive");
    assert_eq!(
        kinds(&sent(&mut core)),
        [(WORKER, Kind::HeartbeatAck as u16)]
    );
}

#[test]
fn an_application_gets_an_executor_placed_on_the_worker() {
    let mut core = core();
    register_worker(&mut core, WORKER, "w1", 0).expect("registers");
    let _ = sent(&mut core);
    let (app_id, mut told) = register_app(&mut core, 0);
    let request = frame(&Message::RequestExecutors {
        app_id: &app_id,
        total: 1,
    });
    core.handle_frame(APP, &request, 1).expect("requests");
    told.extend(sent(&mut core));
    let launch = told
        .iter()
        .find(|(_, f)| f.kind() == Kind::LaunchExecutor as u16)
        .expect("a launch");
    assert_eq!(launch.0, WORKER, "launched on the worker");
    let added = told
        .iter()
        .find(|(_, f)| f.kind() == Kind::ExecutorAdded as u16)
        .expect("the application told");
    assert_eq!(added.0, APP);
    let Ok(Message::ExecutorAdded { worker_id, .. }) = added.1.message() else {
        panic!("not ExecutorAdded");
    };
    assert_eq!(worker_id, "w1");
    let records: Vec<Record> = std::iter::from_fn(|| core.poll_record()).collect();
    assert!(records.contains(&Record::ExecutorsRequested(app_id.clone(), 1)));
    assert!(records
        .iter()
        .any(|r| matches!(r, Record::ExecutorAdded(app, _) if *app == app_id)));
}

#[test]
fn a_duplicate_alive_worker_id_is_refused_with_the_reason() {
    let mut core = core();
    register_worker(&mut core, WORKER, "w1", 0).expect("registers");
    let _ = sent(&mut core);
    let refused = register_worker(&mut core, OTHER, "w1", 1);
    assert!(
        matches!(refused, Err(ConnError::Protocol(_))),
        "{refused:?}"
    );
    let refusal = sent_to(&mut core, OTHER);
    assert_eq!(refusal.len(), 1);
    assert!(matches!(
        refusal[0].message(),
        Ok(Message::RegisterWorkerFailed { .. })
    ));
    // Closing the refused connection leaves the first worker alone.
    core.handle_closed(OTHER, &ConnError::Protocol("refused".into()));
    assert!(core.master().is_worker_alive("w1"));
}

#[test]
fn a_status_client_gets_the_cluster_and_counts_as_a_client() {
    let mut core = core();
    register_worker(&mut core, WORKER, "w1", 0).expect("registers");
    let _ = sent(&mut core);
    assert!(open(&mut core, OTHER, Role::Client), "opens");
    assert_eq!(core.standing(OTHER), Standing::Client);
    core.handle_frame(OTHER, &frame(&Message::StatusRequest {}), 1)
        .expect("answered");
    let answer = sent(&mut core);
    assert_eq!(kinds(&answer), [(OTHER, Kind::StatusResponse as u16)]);
    let Ok(Message::StatusResponse { workers, .. }) = answer[0].1.message() else {
        panic!("not a status");
    };
    let ids: Vec<&str> = workers.iter().map(|w| w.worker_id).collect();
    assert_eq!(ids, ["w1"]);
    let sneaky = frame(&Message::RegisterWorker {
        worker_id: "w2",
        host: "h",
        port: 0,
        cores: 1,
        memory_mb: 1,
    });
    assert!(
        core.handle_frame(OTHER, &sneaky, 2).is_err(),
        "a client cannot register"
    );
}

#[test]
fn a_silent_worker_expires_is_journaled_removed_and_closed() {
    let mut core = core();
    register_worker(&mut core, WORKER, "w1", 0).expect("registers");
    let _ = sent(&mut core);
    let _ = std::iter::from_fn(|| core.poll_record()).count();
    core.handle_timeout(5 * S);
    assert!(core.poll_close().is_none(), "expired too early");
    core.handle_timeout(16 * S);
    assert!(!core.master().is_worker_alive("w1"));
    assert_eq!(core.poll_record(), Some(Record::WorkerRemoved("w1".into())));
    let (peer, why) = core.poll_close().expect("the connection closed");
    assert_eq!(peer, WORKER);
    assert!(why.to_string().contains("worker removed"), "{why}");
    assert_eq!(core.phase(WORKER), None, "closed, no longer a worker");
    let heartbeat = frame(&Message::WorkerHeartbeat { worker_id: "w1" });
    assert!(core.handle_frame(WORKER, &heartbeat, 17 * S).is_err());
    assert_eq!(core.poll_timeout(), Some(16 * S + 250_000));
}

#[test]
fn application_connections_are_bounded_so_workers_keep_room() {
    let mut core = core();
    assert!(open(&mut core, Token(10), Role::Driver), "first");
    assert!(open(&mut core, Token(11), Role::Driver), "second");
    core.handle_connected(Token(12), [1; 32], 0).expect("room");
    let mut out = BytesMut::new();
    let mut ours = Handshake::connect(Role::Driver, None, [2; 32], &[Role::Master], &mut out);
    for frame in sent_to(&mut core, Token(12)) {
        let _ = ours.on_frame(frame.kind(), frame.body(), &mut out);
    }
    for frame in frames(&out) {
        let _ = core.handle_frame(Token(12), &frame, 0);
    }
    let told = sent_to(&mut core, Token(12));
    let refused = told.iter().find_map(|f| match f.message() {
        Ok(Message::HandshakeRefused { reason }) => Some(reason.to_owned()),
        _ => None,
    });
    assert!(
        refused.as_ref().is_some_and(|r| r.contains(TABLE_FULL)),
        "{refused:?}"
    );
    assert_eq!(core.poll_close().map(|(peer, _)| peer), Some(Token(12)));
    assert!(
        open(&mut core, WORKER, Role::Worker),
        "workers still get in"
    );
}

#[test]
fn an_application_comes_back_to_a_restarted_master_and_unregisters() {
    let mut master = Master::new(sa::Config::default(), "app-test");
    let spec = AppSpec {
        name: "job".into(),
        cores_per_executor: 1,
        ..AppSpec::default()
    };
    let recovered = sa::RecoveredApp {
        id: "app-old-0001".into(),
        spec,
        executor_limit: Some(0),
        next_executor: 0,
    };
    master.handle_recover(Vec::new(), vec![recovered], 0);
    let mut core = MasterCore::new(master, core().config);
    assert!(open(&mut core, APP, Role::Driver), "opens");
    let back = frame(&Message::RequestExecutors {
        app_id: "app-old-0001",
        total: 0,
    });
    core.handle_frame(APP, &back, S).expect("reattached");
    assert_eq!(core.phase(APP), Some(&Phase::App("app-old-0001".into())));
    let unregister = frame(&Message::UnregisterApplication {
        app_id: "app-old-0001",
    });
    core.handle_frame(APP, &unregister, 2 * S)
        .expect("unregisters");
    let told = sent(&mut core);
    assert!(kinds(&told).contains(&(APP, Kind::ApplicationRemoved as u16)));
    assert_eq!(
        core.phase(APP),
        Some(&Phase::Client),
        "over: a status client"
    );
    let records: Vec<Record> = std::iter::from_fn(|| core.poll_record()).collect();
    assert!(records.contains(&Record::AppRemoved("app-old-0001".into())));
}

#[test]
fn an_unknown_application_coming_back_is_told_it_is_removed() {
    let mut core = core();
    assert!(open(&mut core, APP, Role::Driver), "opens");
    let back = frame(&Message::RequestExecutors {
        app_id: "app-nobody",
        total: 1,
    });
    assert!(core.handle_frame(APP, &back, S).is_err());
    let refusal = sent_to(&mut core, APP);
    assert!(matches!(
        refusal[0].message(),
        Ok(Message::ApplicationRemoved {
            app_id: "app-nobody",
            ..
        })
    ));
}
