//! Issue 25, attackers and careless operators against a standalone cluster of real processes:
//! an application's environment that would run its own code on a worker, a fake master or
//! worker without the secret (raw sockets), a damaged or shared journal, files that are not
//! files, a poison task under `flint submit`.

mod common;

use common::cluster::*;
use common::{free_port, wait_until, DEADLINE};

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use bytes::BytesMut;
use flint_engine::standalone::AppSpec;
use flint_net::standalone::journal::{Journal, Record};
use flint_net::standalone::with_description;
use flint_net::wire::{
    AuthMethod, Frame, FrameDecoder, Kind, List, Message, Role, WorkerState, WorkerStatus,
    FLAG_SEALED, PROTOCOL_VERSION,
};

/// Builds a shared library whose constructor creates `marker`; `None` (and a SKIPPED line)
/// without a C compiler.
fn preload_library(dir: &Path, marker: &Path) -> Option<std::path::PathBuf> {
    let source = dir.join("pwn.c");
    let library = dir.join("libpwn.so");
    std::fs::write(
        &source,
        format!(
            "#include <stdio.h>\n\
             __attribute__((constructor)) static void pwn(void) {{\n\
             FILE *f = fopen(\"{}\", \"w\"); if (f) {{ fputs(\"ran\", f); fclose(f); }}\n\
             }}\n",
            marker.display()
        ),
    )
    .expect("write pwn.c");
    let built = Command::new("gcc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&library)
        .arg(&source)
        .status();
    match built {
        Ok(status) if status.success() => Some(library),
        other => {
            println!("SKIPPED preload: no working gcc ({other:?})");
            None
        }
    }
}

/// Issue 25, item 1: an application (holding the secret) that sets `LD_PRELOAD` and other
/// loader variables for its executors: the library never runs, the loader variables never
/// reach the executor, the application's own `FLINT_APP_*` variables do, and the worker names
/// what it dropped. (On 66efba5 the library's constructor ran in the executor.)
#[test]
fn an_applications_loader_variables_never_reach_its_executors() {
    let dir = scratch("preload");
    let marker = dir.join("preload-ran");
    let Some(library) = preload_library(&dir, &marker) else {
        return;
    };
    let port = free_port();
    let _master = start_master(&dir, port, &[]);
    let worker = start_worker_allowing(&dir, port, "w1", "127.0.0.2", 1, &["/bin/sh"]);
    wait_status(port, "the worker", |s| s.alive_workers() == 1);
    let seen = dir.join("env.txt");
    let script = format!("env > {0}.tmp && mv {0}.tmp {0}", seen.display());
    let library = library.to_string_lossy().into_owned();
    let spec = AppSpec {
        name: "preload".into(),
        driver_addr: "127.0.0.1:1".into(),
        command: "/bin/sh".into(),
        args: vec!["-c".into(), script],
        env: vec![
            ("LD_PRELOAD".into(), library.clone()),
            ("LD_LIBRARY_PATH".into(), "/app-chose-this".into()),
            ("LD_AUDIT".into(), library),
            ("GCONV_PATH".into(), "/app-chose-this".into()),
            ("FLINT_APP_GREETING".into(), "hello".into()),
            ("RUST_LOG".into(), "debug".into()),
        ],
        cores_per_executor: 1,
        max_cores: 1,
        ..AppSpec::default()
    };
    let client = app_client(port, spec, 1);
    wait_until("the executor to write its environment", || seen.exists());
    let env = std::fs::read_to_string(&seen).expect("env.txt");
    assert!(
        !marker.exists(),
        "the application's preload library ran in its executor"
    );
    assert!(env.contains("FLINT_APP_GREETING=hello"), "{env}");
    assert!(env.contains("RUST_LOG=debug"), "{env}");
    // (The worker's own environment, which cargo gives an LD_LIBRARY_PATH, is the
    // operator's and still passes.)
    assert!(!env.contains("LD_PRELOAD="), "{env}");
    assert!(!env.contains("LD_AUDIT="), "{env}");
    assert!(!env.contains("/app-chose-this"), "{env}");
    for name in ["LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "GCONV_PATH"] {
        assert!(worker.stderr().contains(name), "{}", worker.stderr());
    }
    client.stop(DEADLINE);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Encodes one message as a frame.
fn frame_bytes(message: &Message<'_>) -> Vec<u8> {
    let mut out = BytesMut::new();
    message.encode(&mut out, 1 << 20).expect("encodes");
    out.to_vec()
}

/// Reads frames from `stream` until it closes (or fails): the frames, in order.
fn frames_until_closed(stream: &mut TcpStream) -> Vec<Frame> {
    stream.set_read_timeout(Some(DEADLINE)).expect("timeout");
    let mut decoder = FrameDecoder::new(1 << 24);
    let mut frames = Vec::new();
    loop {
        match decoder.next_frame() {
            Ok(Some(frame)) => frames.push(frame),
            Ok(None) => match decoder.read_from(stream) {
                Ok(0) | Err(_) => return frames,
                Ok(_) => {}
            },
            Err(_) => return frames,
        }
    }
}

/// What a relay sees from one side: the frames it sent after the handshake, whether its
/// handshake frames have passed, whether it has closed.
#[derive(Default)]
struct Heard {
    frames: Mutex<Vec<Frame>>,
    handshaken: AtomicBool,
    closed: AtomicBool,
}

impl Heard {
    fn closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    fn frames(&self) -> Vec<Frame> {
        self.frames.lock().expect("lock").clone()
    }
}

/// One direction of a relay: forwards the first `handshake_frames` frames from `from` to `to`
/// as they came, then reads on (forwarding nothing) until `from` closes.
fn relay_direction(
    mut from: TcpStream,
    mut to: TcpStream,
    handshake_frames: usize,
    heard: Arc<Heard>,
) {
    std::thread::spawn(move || {
        let mut decoder = FrameDecoder::new(1 << 24);
        let mut forwarded = 0;
        loop {
            let frame = match decoder.next_frame() {
                Ok(Some(frame)) => frame,
                Ok(None) => match decoder.read_from(&mut from) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => continue,
                },
                Err(_) => break,
            };
            if forwarded == handshake_frames {
                heard.frames.lock().expect("lock").push(frame);
                continue;
            }
            if to.write_all(&raw_frame(&frame)).is_err() {
                break;
            }
            forwarded += 1;
            heard
                .handshaken
                .store(forwarded == handshake_frames, Ordering::SeqCst);
        }
        heard.closed.store(true, Ordering::SeqCst);
    });
}

/// A frame's bytes as they came (the header with its sealed flag, the body).
fn raw_frame(frame: &Frame) -> Vec<u8> {
    let flags: u16 = if frame.is_sealed() { FLAG_SEALED } else { 0 };
    let mut out = Vec::with_capacity(8 + frame.body().len());
    out.extend_from_slice(&(frame.body().len() as u32).to_le_bytes());
    out.extend_from_slice(&frame.kind().to_le_bytes());
    out.extend_from_slice(&flags.to_le_bytes());
    out.extend_from_slice(frame.body());
    out
}

/// A process without the secret in the middle: it accepts one connection from a victim on
/// its own port, connects to the real peer, relays the whole handshake both ways (each side's
/// `Hello` and proof, as a transparent proxy would), then stops relaying and injects what it
/// likes.
struct Relay {
    addr: SocketAddr,
    /// The victim's connection and what it sent; the real peer's likewise.
    victim: Option<(TcpStream, Arc<Heard>)>,
    real: Option<(TcpStream, Arc<Heard>)>,
    accepting: Option<std::thread::JoinHandle<(TcpStream, TcpStream)>>,
}

impl Relay {
    fn start(real: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let accepting = std::thread::spawn(move || {
            let (victim, _) = listener.accept().expect("a victim");
            let upstream = TcpStream::connect(real).expect("the real peer");
            (victim, upstream)
        });
        Relay {
            addr,
            victim: None,
            real: None,
            accepting: Some(accepting),
        }
    }

    /// Waits for the victim and for the handshake to pass through both ways.
    fn handshake_relayed(&mut self) {
        let accepting = self.accepting.take().expect("not yet");
        let (victim, real) = accepting.join().expect("relay");
        let clone = |s: &TcpStream| s.try_clone().expect("clone");
        let (from_victim, from_real) = (Arc::<Heard>::default(), Arc::<Heard>::default());
        relay_direction(clone(&victim), clone(&real), 2, from_victim.clone());
        relay_direction(clone(&real), clone(&victim), 2, from_real.clone());
        wait_until("the relayed handshake", || {
            [&from_victim, &from_real]
                .iter()
                .all(|h| h.handshaken.load(Ordering::SeqCst) || h.closed())
        });
        self.victim = Some((victim, from_victim));
        self.real = Some((real, from_real));
    }

    fn inject_to_victim(&mut self, frames: &[u8]) {
        let _ = self.victim.as_mut().expect("victim").0.write_all(frames);
    }

    fn inject_to_real(&mut self, frames: &[u8]) {
        let _ = self.real.as_mut().expect("real").0.write_all(frames);
    }

    fn heard_from_victim(&self) -> &Heard {
        &self.victim.as_ref().expect("victim").1
    }

    fn heard_from_real(&self) -> &Heard {
        &self.real.as_ref().expect("real").1
    }
}

/// Issue 25, item 2: a process without the secret that makes a worker connect to it and relays
/// that connection to the real master, the whole handshake both ways included, can be neither
/// the worker's master (the worker runs nothing it injects: the frames it injects break the
/// connection's seal and the worker drops it) nor a worker of the master's (the master
/// registers nothing it injects). On 66efba5 the relayed proofs opened both connections and the
/// worker ran the injected executor.
#[test]
fn a_relay_without_the_secret_can_be_neither_master_nor_worker() {
    let dir = scratch("relay");
    let port = free_port();
    let _master = start_master(&dir, port, &[]);
    let mut relay = Relay::start(SocketAddr::from(([127, 0, 0, 1], port)));
    let marker = dir.join("injected-ran");
    let relay_port = relay.addr.port();
    let _victim = start_worker_allowing(&dir, relay_port, "victim", "127.0.0.2", 1, &["/bin/sh"]);
    relay.handshake_relayed();
    // As the master, to the worker: registered, and start this.
    let spec = AppSpec {
        name: "evil".into(),
        driver_addr: "127.0.0.1:1".into(),
        command: "/bin/sh".into(),
        args: vec!["-c".into(), format!("touch {}", marker.display())],
        cores_per_executor: 1,
        max_cores: 1,
        ..AppSpec::default()
    };
    let mut to_worker = frame_bytes(&Message::RegisteredWorker {
        heartbeat_interval_ms: 1000,
    });
    to_worker.extend(with_description(&spec, |app| {
        frame_bytes(&Message::LaunchExecutor {
            app_id: "app-evil",
            executor_id: "0",
            app,
            cores: 1,
            memory_mb: 0,
        })
    }));
    relay.inject_to_victim(&to_worker);
    // As a worker, to the master.
    relay.inject_to_real(&frame_bytes(&Message::RegisterWorker {
        worker_id: "evil",
        host: "127.0.0.9",
        port: 1,
        cores: 64,
        memory_mb: 1 << 20,
    }));
    wait_until("the worker to run the injection or drop the relay", || {
        marker.exists() || relay.heard_from_victim().closed()
    });
    assert!(!marker.exists(), "the worker ran what the relay injected");
    wait_until(
        "the master to register the injection or drop the relay",
        || {
            status(port).is_some_and(|s| s.worker_state("evil").is_some())
                || relay.heard_from_real().closed()
        },
    );
    let snapshot = status_now(port);
    assert!(snapshot.worker_state("evil").is_none(), "{snapshot:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 25, item 2: `flint status` pointed at a relay prints nothing the relay made up (it
/// fails on the broken seal), and the master answers no request the relay injects. On 66efba5
/// `flint status` printed the relay's workers.
#[test]
fn a_relay_without_the_secret_can_be_no_status_client_and_fool_none() {
    let dir = scratch("relay-status");
    let port = free_port();
    let _master = start_master(&dir, port, &[]);
    let mut relay = Relay::start(SocketAddr::from(([127, 0, 0, 1], port)));
    let relay_addr = relay.addr.to_string();
    let status_run = std::thread::spawn(move || {
        flint_output(
            &[
                "status",
                "--master",
                &relay_addr,
                "--json",
                "--timeout-ms",
                "20000",
            ],
            &[("FLINT_SECRET", SECRET)],
        )
    });
    relay.handshake_relayed();
    let fake = [WorkerStatus {
        worker_id: "made-up-by-the-relay",
        host: "127.0.0.9",
        port: 1,
        state: WorkerState::Alive,
        cores: 1000,
        cores_used: 0,
        memory_mb: 1,
        memory_used_mb: 0,
    }];
    relay.inject_to_victim(&frame_bytes(&Message::StatusResponse {
        workers: List::from_items(&fake),
        applications: List::empty(),
        executors: List::empty(),
    }));
    relay.inject_to_real(&frame_bytes(&Message::StatusRequest {}));
    let (code, stdout, stderr) = status_run.join().expect("flint status");
    assert!(!stdout.contains("made-up-by-the-relay"), "{stdout}");
    assert_ne!(code, Some(0), "{stdout} {stderr}");
    wait_until("the master to answer or drop the relay", || {
        relay.heard_from_real().closed() || !relay.heard_from_real().frames().is_empty()
    });
    let answered = relay.heard_from_real().frames();
    assert!(
        answered.is_empty(),
        "the master answered the relay: {answered:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 25, item 2: a master proves nothing to a peer that has not proved itself first: a
/// `Hello` and a made-up proof get its `Hello` and a refusal, never its proof. On 66efba5 the
/// master sent its proof over the caller's nonce right after its `Hello`.
#[test]
fn the_master_proves_nothing_to_a_peer_that_has_not_proved_itself() {
    let dir = scratch("no-proof");
    let port = free_port();
    let _master = start_master(&dir, port, &[]);
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let mut out = frame_bytes(&Message::hello(
        Role::Worker,
        AuthMethod::HmacSha256,
        [7; 32],
    ));
    out.extend(frame_bytes(&Message::AuthProof { proof: [9; 32] }));
    stream.write_all(&out).expect("write");
    let frames = frames_until_closed(&mut stream);
    let kinds: Vec<u16> = frames.iter().map(Frame::kind).collect();
    assert!(
        !kinds.contains(&(Kind::AuthProof as u16)),
        "the master proved itself to a stranger: {kinds:?}"
    );
    let refusal = frames.iter().find_map(|f| match f.message() {
        Ok(Message::HandshakeRefused { reason }) => Some(reason.to_owned()),
        _ => None,
    });
    assert!(
        refusal
            .as_deref()
            .is_some_and(|r| r.contains("wrong shared secret")),
        "{refusal:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 25, item 2: a peer of the previous protocol version (2) is refused with a reason that
/// names both versions.
#[test]
fn an_old_peer_is_refused_naming_both_versions() {
    let dir = scratch("old-peer");
    let port = free_port();
    let _master = start_master(&dir, port, &[]);
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let mut hello = frame_bytes(&Message::hello(
        Role::Worker,
        AuthMethod::HmacSha256,
        [7; 32],
    ));
    // Header (8), magic (4), then the version.
    hello[12..14].copy_from_slice(&2u16.to_le_bytes());
    stream.write_all(&hello).expect("write");
    let frames = frames_until_closed(&mut stream);
    let refusal = frames.iter().find_map(|f| match f.message() {
        Ok(Message::HandshakeRefused { reason }) => Some(reason.to_owned()),
        _ => None,
    });
    let expected = format!("we speak {PROTOCOL_VERSION}, the peer speaks 2");
    assert!(
        PROTOCOL_VERSION != 2 && refusal.as_deref().is_some_and(|r| r.contains(&expected)),
        "{refusal:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A master on a free port with its journal in `state`, waiting 60 s for journaled drivers (so
/// recovered applications stay listed); started once it listens, with its port. A port another
/// process took meanwhile is given up for another.
fn master_on(dir: &Path, state: &Path) -> (Proc, u16) {
    let state = state.to_string_lossy();
    for _ in 0..5 {
        let port = free_port();
        let listen = format!("127.0.0.1:{port}");
        let args = ["master", "--listen", &listen, "--state-dir", &state];
        let extra = ["--recovery-timeout-ms", "60000"];
        let mut master = Proc::start(dir, "master", &[&args[..], &extra].concat());
        wait_until("the master to listen or exit", || {
            let exited = master.child.try_wait().ok().flatten().is_some();
            exited || TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        if master.child.try_wait().ok().flatten().is_none() {
            return (master, port);
        }
        let stderr = master.stderr();
        assert!(stderr.contains("in use"), "the master exited: {stderr}");
    }
    panic!("no free port for the master");
}

/// The application ids a master on `port` lists.
fn app_ids(port: u16) -> Vec<String> {
    let mut ids: Vec<String> = status_now(port)
        .apps
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    ids.sort();
    ids
}

/// Writes a journal in `state` holding applications `app-1` .. `app-5` (named `job-N`).
fn five_applications(state: &Path) {
    let (mut journal, _) = Journal::open(state).expect("journal");
    for n in 1..=5 {
        let spec = AppSpec {
            name: format!("job-{n}"),
            driver_addr: "127.0.0.1:1".into(),
            cores_per_executor: 1,
            max_cores: 1,
            ..AppSpec::default()
        };
        journal.record(&Record::AppRegistered(format!("app-{n}"), spec));
    }
    journal.flush();
}

/// Where `needle` starts in `haystack`.
fn find(haystack: &[u8], needle: &[u8]) -> usize {
    (haystack.windows(needle.len()).position(|w| w == needle)).expect("found")
}

/// A damage to a journal of [`five_applications`]: what it is, what it does to the bytes,
/// the applications that survive it, the one it loses (named in the log).
type JournalDamage = (
    &'static str,
    fn(&mut Vec<u8>),
    Vec<String>,
    Option<&'static str>,
);

/// Garbage inserted and a length smashed in app-3's description, a cut in app-5's, garbage
/// appended.
fn journal_damages() -> [JournalDamage; 4] {
    let all: Vec<String> = (1..=5).map(|n| format!("app-{n}")).collect();
    let without =
        |lost: &str| -> Vec<String> { all.iter().filter(|id| *id != lost).cloned().collect() };
    [
        (
            "garbage inserted in app-3's description",
            |bytes| {
                let at = find(bytes, b"job-3");
                bytes.splice(at..at, [0xEE; 64]);
            },
            without("app-3"),
            Some("app-3"),
        ),
        (
            "a length field smashed in app-3's description",
            |bytes| {
                let at = find(bytes, b"job-3") - 2;
                bytes[at..at + 2].copy_from_slice(&[0xFF, 0xFF]);
            },
            without("app-3"),
            Some("app-3"),
        ),
        (
            "cut in the middle of app-5's description",
            |bytes| {
                let at = find(bytes, b"job-5");
                bytes.truncate(at);
            },
            without("app-5"),
            Some("app-5"),
        ),
        (
            "garbage appended",
            |bytes| bytes.extend_from_slice(&[0xAB; 50]),
            all.clone(),
            None,
        ),
    ]
}

/// Issue 25, item 3: journals damaged in the middle (garbage inserted, a length field smashed),
/// cut mid-record and with garbage appended: the master keeps every application whose records
/// survive, names each one lost, says where the damage was (the offset), and keeps the damaged
/// file beside the new one. On 66efba5 the replay stopped at the first damage (app-3 .. app-5
/// were gone with a bad record in the middle), said nothing and kept nothing.
#[test]
fn a_damaged_journal_keeps_every_valid_record_names_what_it_lost_and_is_kept_aside() {
    let dir = scratch("journal-damage");
    for (what, damage, expected, lost) in journal_damages() {
        let state = dir.join(what.replace(' ', "-"));
        five_applications(&state);
        let journal = state.join("master.journal");
        let mut bytes = std::fs::read(&journal).expect("journal");
        let intact_len = bytes.len();
        damage(&mut bytes);
        std::fs::write(&journal, &bytes).expect("damage");
        let (mut master, port) = master_on(&dir, &state);
        assert_eq!(app_ids(port), expected, "{what}: {}", master.stderr());
        let stderr = master.stderr();
        if let Some(lost) = lost {
            assert!(
                stderr.contains(lost),
                "{what}: the log does not name {lost}: {stderr}"
            );
        } else {
            let offset = intact_len.to_string();
            assert!(
                stderr.contains(&offset),
                "{what}: no offset {offset}: {stderr}"
            );
        }
        let kept: Vec<Vec<u8>> = std::fs::read_dir(&state)
            .expect("state dir")
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().contains("damaged"))
            .map(|e| std::fs::read(e.path()).expect("kept"))
            .collect();
        assert_eq!(
            kept,
            [bytes],
            "{what}: the damaged journal is not kept as it was"
        );
        master.kill9();
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 25, item 3: a second master on a state directory in use refuses before it touches
/// anything (even on another port), and what the first one journals afterwards survives its
/// restart. On 66efba5 the second master rewrote the journal under the first one, and an
/// application registered afterwards was gone after a restart.
#[test]
fn a_second_master_on_the_same_state_dir_refuses_and_touches_nothing() {
    let dir = scratch("journal-lock");
    let state = dir.join("state");
    five_applications(&state);
    let (mut first, first_port) = master_on(&dir, &state);
    let files = |state: &Path| -> Vec<(String, Vec<u8>)> {
        let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(state)
            .expect("state dir")
            .flatten()
            .map(|e| {
                (
                    e.file_name().to_string_lossy().into_owned(),
                    std::fs::read(e.path()).unwrap_or_default(),
                )
            })
            .collect();
        files.sort();
        files
    };
    let before = files(&state);
    let second_port = free_port();
    let (listen, state_arg) = (format!("127.0.0.1:{second_port}"), state.to_string_lossy());
    let mut second = Proc::start(
        &dir,
        "second",
        &["master", "--listen", &listen, "--state-dir", &state_arg],
    );
    wait_until("the second master to exit or listen", || {
        second.child.try_wait().ok().flatten().is_some()
            || TcpStream::connect(("127.0.0.1", second_port)).is_ok()
    });
    let exit = second.child.try_wait().expect("try_wait");
    assert!(
        exit.is_some_and(|s| !s.success()),
        "a second master runs on the same state dir: {}",
        second.stderr()
    );
    assert_eq!(
        files(&state),
        before,
        "the second master touched the state dir"
    );
    // The first master journals on; a restart recovers it all.
    let late = AppSpec {
        name: "late".into(),
        driver_addr: "127.0.0.1:1".into(),
        cores_per_executor: 1,
        max_cores: 1,
        ..AppSpec::default()
    };
    let client = app_client(first_port, late, 0);
    let late_id = client.wait_registered(DEADLINE).expect("registered");
    first.kill9();
    drop(client);
    let (_restarted, port) = master_on(&dir, &state);
    let ids = app_ids(port);
    assert!(ids.contains(&late_id), "{late_id} lost: {ids:?}");
    assert_eq!(ids.len(), 6, "{ids:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs `flint ARGS` under a 4 GB address-space limit (so a regression that reads `/dev/zero`
/// fails instead of taking the machine's memory); its exit code and stderr.
fn flint_bounded(args: &[&str]) -> (Option<i32>, String) {
    let mut command = Command::new("sh");
    command
        .args(["-c", "ulimit -v 4000000 && exec \"$0\" \"$@\""])
        .arg(env!("CARGO_BIN_EXE_flint"))
        .args(args);
    let dir = std::env::temp_dir();
    let mut proc = Proc::start_with(command, &dir, "bounded", &[]);
    let status = proc.wait();
    let stderr = proc.stderr();
    let _ = std::fs::remove_file(&proc.stdout);
    let _ = std::fs::remove_file(&proc.stderr);
    (status.code(), stderr)
}

/// Issue 25, item 7: a secret file or a pool file that is `/dev/zero`, a FIFO, a directory or
/// larger than its cap is refused at once with the reason (exit 2), reading nothing past the
/// cap. On 66efba5 `/dev/zero` was read until memory ran out and a FIFO hung the process.
#[test]
fn secret_and_pool_files_must_be_small_regular_files() {
    let dir = scratch("files");
    let fifo = dir.join("fifo");
    let made = Command::new("mkfifo").arg(&fifo).status();
    assert!(made.is_ok_and(|s| s.success()), "mkfifo");
    let huge = dir.join("huge");
    std::fs::write(&huge, vec![b'a'; 2 << 20]).expect("huge");
    let bad = [
        ("/dev/zero".to_owned(), "a character device"),
        (fifo.to_string_lossy().into_owned(), "a FIFO"),
        (dir.to_string_lossy().into_owned(), "a directory"),
        (huge.to_string_lossy().into_owned(), "at most"),
    ];
    let port = free_port().to_string();
    let listen = format!("127.0.0.1:{port}");
    for (path, why) in &bad {
        let runs: [Vec<&str>; 4] = [
            vec!["status", "--master", "127.0.0.1:1", "--secret-file", path],
            vec!["master", "--listen", &listen, "--secret-file", path],
            vec!["executor", "--driver", "127.0.0.1:1", "--secret-file", path],
            vec!["driver", "--executors", "1", "--pools", path],
        ];
        for args in runs {
            let (code, stderr) = flint_bounded(&args);
            assert_eq!(code, Some(2), "{args:?}: {stderr}");
            assert!(stderr.contains(why), "{args:?}: {stderr}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 25, item 7: every role that reads a secret file warns when other users may read it
/// (naming the file). On 66efba5 only the master did.
#[test]
fn every_role_warns_about_a_secret_file_open_to_others() {
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch("open-secret");
    let secret = dir.join("secret");
    std::fs::write(&secret, SECRET).expect("secret");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let path = secret.to_string_lossy().into_owned();
    let (port, work) = (free_port(), dir.join("work").to_string_lossy().into_owned());
    let listen = format!("127.0.0.1:{port}");
    let roles: [Vec<&str>; 6] = [
        vec!["master", "--listen", &listen],
        vec![
            "worker",
            "--master",
            "127.0.0.1:1",
            "--cores",
            "1",
            "--memory-mb",
            "1",
            "--work-dir",
            &work,
        ],
        vec![
            "driver",
            "--listen",
            "127.0.0.1:0",
            "--executors",
            "1",
            "--wait-s",
            "1",
        ],
        vec![
            "executor",
            "--driver",
            "127.0.0.1:1",
            "--connect-timeout-s",
            "1",
        ],
        vec![
            "submit",
            "--master",
            "127.0.0.1:1",
            "--executors",
            "1",
            "--wait-s",
            "1",
        ],
        vec!["status", "--master", "127.0.0.1:1"],
    ];
    for mut args in roles {
        args.extend(["--secret-file", &path]);
        let role = args[0];
        let proc = Proc::start(&dir, role, &args);
        wait_until(&format!("flint {role} to warn about {path}"), || {
            let stderr = proc.stderr();
            stderr.contains(&path) && stderr.contains("chmod 600")
        });
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 25, item 8: a task that aborts every executor it runs on (`crash:1`, SIGABRT) under
/// `flint submit` is charged each crash (the worker's exit code reaches the scheduler through
/// the master and the application client), so its job fails by `--max-failures`, not by the
/// master giving up on the application. On 66efba5 each crash came through as exit code -1,
/// not the application's fault, and the task was retried until the master removed the
/// application.
#[test]
fn a_poison_task_under_submit_fails_its_job_after_max_failures() {
    let dir = scratch("poison");
    let port = free_port();
    // The master would give up on the application after 1000 crashes in a row: the job must
    // end first, by its own max_failures. (A crash takes a few ms here, faster than the
    // lifecycle handler's 20 ms watch, so a low limit could race it.)
    let _master = start_master(&dir, port, &["--max-executor-retries", "1000"]);
    let _worker = start_worker(&dir, port, "w1", "127.0.0.2", 1);
    wait_status(port, "the worker", |s| s.alive_workers() == 1);
    let mut job = submit_with(&dir, port, 1, 1, "crash:1", &["--max-failures", "2"]);
    let status = job.wait();
    let (stdout, stderr) = (job.stdout(), job.stderr());
    assert!(!status.success(), "{stdout} {stderr}");
    assert!(stdout.contains("\"failed\":1"), "{stdout}\n{stderr}");
    // Crashes charged late (their exit learned after the executor was lost) can make it 3.
    assert!(
        stderr.contains("task 0 failed") && stderr.contains("(max_failures = 2)"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("the master removed the application"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
