//! Behaviour of the runtime: endpoint lifecycle order, per-sender FIFO under many producers,
//! drain on shutdown, ask timeouts, panic isolation, timers, mio readiness, backpressure.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flint_engine::runtime::{
    AskError, Ctx, Endpoint, LookupError, Reply, Runtime, RuntimeConfig, SendError, TimerId,
};

const DEADLINE: Duration = Duration::from_secs(10);

fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + DEADLINE;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn runtime(threads: usize) -> Runtime {
    Runtime::new(RuntimeConfig {
        threads,
        ..Default::default()
    })
    .expect("runtime")
}

/// Records its lifecycle into a shared log.
struct Recorder {
    log: Arc<Mutex<Vec<String>>>,
}

enum RecMsg {
    Note(u32),
    Count(Reply<usize>),
    Panic,
    Ignore(Reply<()>),
    Hold(Reply<()>),
}

impl Endpoint for Recorder {
    type Msg = RecMsg;
    fn on_start(&mut self, _ctx: &mut Ctx<'_, Self>) {
        self.log.lock().unwrap().push("start".into());
    }
    fn on_message(&mut self, msg: RecMsg, _ctx: &mut Ctx<'_, Self>) {
        match msg {
            RecMsg::Note(n) => self.log.lock().unwrap().push(format!("m{n}")),
            RecMsg::Count(r) => {
                let _ = r.send(self.log.lock().unwrap().len());
            }
            RecMsg::Panic => panic!("handler exploded"),
            RecMsg::Ignore(r) => drop(r),
            RecMsg::Hold(r) => std::mem::forget(r),
        }
    }
    fn on_stop(&mut self, _ctx: &mut Ctx<'_, Self>) {
        self.log.lock().unwrap().push("stop".into());
    }
}

fn recorder() -> (Recorder, Arc<Mutex<Vec<String>>>) {
    let log = Arc::new(Mutex::new(Vec::new()));
    (Recorder { log: log.clone() }, log)
}

#[test]
fn on_start_runs_first_and_on_stop_last() {
    let rt = runtime(2);
    let (ep, log) = recorder();
    let r = rt.handle().spawn("rec", ep).unwrap();
    for i in 0..100 {
        r.send_timeout(RecMsg::Note(i), DEADLINE).unwrap();
    }
    r.stop().unwrap();
    wait_until("on_stop", || {
        log.lock().unwrap().last().map(String::as_str) == Some("stop")
    });
    let log = log.lock().unwrap().clone();
    assert_eq!(log.len(), 102);
    assert_eq!(log[0], "start");
    for i in 0..100 {
        assert_eq!(log[i + 1], format!("m{i}"));
    }
    wait_until("stopped visible", || !r.is_alive());
    assert!(matches!(
        r.send(RecMsg::Note(0)),
        Err(SendError::Stopped(_))
    ));
    assert!(matches!(
        rt.handle().lookup::<Recorder>("rec"),
        Err(LookupError::Unknown(_))
    ));
}

/// Checks that each sender's sequence numbers arrive strictly in order.
struct FifoChecker {
    next: Vec<u64>,
    violations: usize,
    received: usize,
}

enum FifoMsg {
    Item { sender: usize, seq: u64 },
    Report(Reply<(usize, usize)>),
}

impl Endpoint for FifoChecker {
    type Msg = FifoMsg;
    fn on_message(&mut self, msg: FifoMsg, _ctx: &mut Ctx<'_, Self>) {
        match msg {
            FifoMsg::Item { sender, seq } => {
                if self.next[sender] != seq {
                    self.violations += 1;
                }
                self.next[sender] = seq + 1;
                self.received += 1;
            }
            FifoMsg::Report(r) => {
                let _ = r.send((self.received, self.violations));
            }
        }
    }
}

#[test]
fn stress_many_producers_keep_per_sender_fifo() {
    const SENDERS: usize = 8;
    const PER_SENDER: u64 = 20_000;
    let rt = Runtime::new(RuntimeConfig {
        threads: 2,
        inbox_capacity: 64, // small, so producers hit backpressure
        ..Default::default()
    })
    .unwrap();
    let checker = rt
        .handle()
        .spawn(
            "fifo",
            FifoChecker {
                next: vec![0; SENDERS],
                violations: 0,
                received: 0,
            },
        )
        .unwrap();
    let producers: Vec<_> = (0..SENDERS)
        .map(|sender| {
            let checker = checker.clone();
            std::thread::spawn(move || {
                for seq in 0..PER_SENDER {
                    checker
                        .send_timeout(FifoMsg::Item { sender, seq }, DEADLINE)
                        .expect("send with backpressure");
                }
            })
        })
        .collect();
    for p in producers {
        p.join().unwrap();
    }
    let (received, violations) = checker.ask(FifoMsg::Report, DEADLINE).unwrap();
    assert_eq!(received, SENDERS * PER_SENDER as usize);
    assert_eq!(violations, 0);
}

#[test]
fn shutdown_drains_queued_messages_then_stops_and_rejects_sends() {
    let mut rt = runtime(2);
    let (ep, log) = recorder();
    let r = rt.handle().spawn("rec", ep).unwrap();
    for i in 0..1000 {
        r.send_timeout(RecMsg::Note(i), DEADLINE).unwrap();
    }
    rt.shutdown();
    let log = log.lock().unwrap().clone();
    assert_eq!(
        log.len(),
        1002,
        "every message queued before the pill was handled"
    );
    assert_eq!(log.first().unwrap(), "start");
    assert_eq!(log.last().unwrap(), "stop");
    assert!(matches!(
        r.send(RecMsg::Note(0)),
        Err(SendError::Shutdown(_))
    ));
    assert_eq!(
        r.ask(RecMsg::Count, Duration::from_millis(10)).unwrap_err(),
        AskError::Shutdown
    );
}

#[test]
fn ask_replies_times_out_and_reports_dropped_replies() {
    let rt = runtime(1);
    let (ep, _log) = recorder();
    let r = rt.handle().spawn("rec", ep).unwrap();
    assert_eq!(r.ask(RecMsg::Count, DEADLINE).unwrap(), 1);
    let err = r.ask(RecMsg::Hold, Duration::from_millis(50)).unwrap_err();
    assert_eq!(err, AskError::Timeout { timeout_ms: 50 });
    let err = r.ask(RecMsg::Ignore, DEADLINE).unwrap_err();
    assert_eq!(err, AskError::Stopped);
}

#[test]
fn handler_panic_stops_only_that_endpoint() {
    let rt = runtime(1); // both endpoints on the same loop
    let (bad, bad_log) = recorder();
    let (good, _good_log) = recorder();
    let bad = rt.handle().spawn_on(0, "bad", bad).unwrap();
    let good = rt.handle().spawn_on(0, "good", good).unwrap();
    bad.send(RecMsg::Panic).unwrap();
    wait_until("panicked endpoint stopped", || !bad.is_alive());
    assert!(matches!(
        bad.send(RecMsg::Note(1)),
        Err(SendError::Stopped(_))
    ));
    assert_eq!(
        bad.ask(RecMsg::Count, DEADLINE).unwrap_err(),
        AskError::Stopped
    );
    assert_eq!(good.ask(RecMsg::Count, DEADLINE).unwrap(), 1);
    assert_eq!(*bad_log.lock().unwrap(), vec!["start".to_string()]);
}

#[test]
fn lookup_by_name_and_type() {
    let rt = runtime(2);
    let (ep, _log) = recorder();
    rt.handle().spawn("named", ep).unwrap();
    let r = rt.handle().lookup::<Recorder>("named").unwrap();
    assert_eq!(r.ask(RecMsg::Count, DEADLINE).unwrap(), 1);
    assert!(matches!(
        rt.handle().lookup::<FifoChecker>("named"),
        Err(LookupError::WrongType(_))
    ));
    assert!(matches!(
        rt.handle().lookup::<Recorder>("nobody"),
        Err(LookupError::Unknown(_))
    ));
}

/// Sets a one-shot and a periodic timer; cancels the periodic one after 3 ticks, then sets a
/// one-shot "probe" well after the next tick would have been due.
struct Clock {
    period: Option<TimerId>,
    probe: Option<TimerId>,
    ticks: usize,
    once_fired: bool,
    ticks_at_probe: Option<usize>,
    done: Arc<Mutex<Option<(bool, usize, usize)>>>,
}

impl Endpoint for Clock {
    type Msg = ();
    fn on_start(&mut self, ctx: &mut Ctx<'_, Self>) {
        ctx.timer_once(Duration::from_millis(5)).unwrap();
        self.period = Some(ctx.timer_periodic(Duration::from_millis(10)).unwrap());
    }
    fn on_message(&mut self, _: (), _ctx: &mut Ctx<'_, Self>) {}
    fn on_timer(&mut self, timer: TimerId, ctx: &mut Ctx<'_, Self>) {
        if Some(timer) == self.period {
            self.ticks += 1;
            if self.ticks == 3 {
                assert!(ctx.cancel_timer(timer));
                assert!(!ctx.cancel_timer(timer));
                self.probe = Some(ctx.timer_once(Duration::from_millis(50)).unwrap());
            }
        } else if Some(timer) == self.probe {
            self.ticks_at_probe = Some(self.ticks);
            *self.done.lock().unwrap() = Some((self.once_fired, self.ticks, self.ticks));
        } else {
            self.once_fired = true;
        }
    }
}

#[test]
fn timers_fire_once_periodically_and_cancel() {
    let rt = runtime(1);
    let done = Arc::new(Mutex::new(None));
    rt.handle()
        .spawn(
            "clock",
            Clock {
                period: None,
                probe: None,
                ticks: 0,
                once_fired: false,
                ticks_at_probe: None,
                done: done.clone(),
            },
        )
        .unwrap();
    wait_until("probe timer", || done.lock().unwrap().is_some());
    let (once_fired, ticks, _) = done.lock().unwrap().unwrap();
    assert!(once_fired);
    assert_eq!(ticks, 3, "no tick after the periodic timer was cancelled");
}

/// Registers a UDP socket on its loop and counts datagrams; each message takes `per_message`.
struct Udp {
    socket: mio::net::UdpSocket,
    got: Arc<AtomicUsize>,
    per_message: Duration,
}

impl Endpoint for Udp {
    type Msg = ();
    fn on_start(&mut self, ctx: &mut Ctx<'_, Self>) {
        ctx.register(&mut self.socket, mio::Interest::READABLE)
            .unwrap();
    }
    fn on_message(&mut self, _: (), _ctx: &mut Ctx<'_, Self>) {
        let until = Instant::now() + self.per_message;
        while Instant::now() < until {
            std::hint::spin_loop();
        }
    }
    fn on_readiness(&mut self, _t: mio::Token, _e: &mio::event::Event, _ctx: &mut Ctx<'_, Self>) {
        let mut buf = [0u8; 64];
        while let Ok(n) = self.socket.recv(&mut buf) {
            assert_eq!(&buf[..n], b"ping");
            self.got.fetch_add(1, Ordering::SeqCst);
        }
    }
}

#[test]
fn endpoints_get_readiness_of_registered_sources() {
    let rt = runtime(2);
    let socket = mio::net::UdpSocket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = socket.local_addr().unwrap();
    let got = Arc::new(AtomicUsize::new(0));
    rt.handle()
        .spawn(
            "udp",
            Udp {
                socket,
                got: got.clone(),
                per_message: Duration::ZERO,
            },
        )
        .unwrap();
    let client = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    // Resend until the first datagram is seen (the registration happens on the loop).
    wait_until("first datagram", || {
        client.send_to(b"ping", addr).unwrap();
        got.load(Ordering::SeqCst) > 0
    });
    let before = got.load(Ordering::SeqCst);
    client.send_to(b"ping", addr).unwrap();
    wait_until("second datagram", || got.load(Ordering::SeqCst) > before);
}

/// A loop that keeps getting messages still hears its sockets: a round that takes the whole
/// inbox skips the poll (the next round's park polls), but never two rounds in a row, so an
/// inbox that never runs dry (slow messages, a fast sender, rounds that never reach
/// `batch_max`) cannot hold a datagram back.
#[test]
fn readiness_is_heard_while_messages_keep_coming() {
    let rt = Runtime::new(RuntimeConfig {
        threads: 1,
        inbox_capacity: 64,
        batch_max: 1 << 20,
        ..Default::default()
    })
    .expect("runtime");
    let socket = mio::net::UdpSocket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = socket.local_addr().unwrap();
    let got = Arc::new(AtomicUsize::new(0));
    let udp = (rt.handle())
        .spawn(
            "udp",
            Udp {
                socket,
                got: got.clone(),
                per_message: Duration::from_micros(20),
            },
        )
        .unwrap();
    let client = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    wait_until("first datagram", || {
        client.send_to(b"ping", addr).unwrap();
        got.load(Ordering::SeqCst) > 0
    });
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sent = Arc::new(AtomicUsize::new(0));
    let flood = {
        let (stop, sent) = (stop.clone(), sent.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                if udp.send(()).is_ok() {
                    sent.fetch_add(1, Ordering::SeqCst);
                }
            }
        })
    };
    wait_until("the flood under way", || {
        sent.load(Ordering::SeqCst) > 1_000
    });
    let before = got.load(Ordering::SeqCst);
    client.send_to(b"ping", addr).unwrap();
    wait_until("a datagram during the flood", || {
        got.load(Ordering::SeqCst) > before
    });
    assert!(!flood.is_finished(), "the flood ran all along");
    stop.store(true, Ordering::SeqCst);
    flood.join().unwrap();
}

/// Records its readiness events and timers in order; a message sets a timer, sends itself a
/// datagram and then keeps its loop busy past both.
struct Busy {
    socket: mio::net::UdpSocket,
    log: Arc<Mutex<Vec<&'static str>>>,
}

impl Endpoint for Busy {
    type Msg = Duration;
    fn on_start(&mut self, ctx: &mut Ctx<'_, Self>) {
        ctx.register(&mut self.socket, mio::Interest::READABLE)
            .unwrap();
    }
    fn on_message(&mut self, busy: Duration, ctx: &mut Ctx<'_, Self>) {
        ctx.timer_once(Duration::from_millis(1)).unwrap();
        let me = self.socket.local_addr().unwrap();
        self.socket.send_to(b"ping", me).unwrap();
        let until = Instant::now() + busy;
        while Instant::now() < until {
            std::hint::spin_loop();
        }
    }
    fn on_readiness(&mut self, _t: mio::Token, _e: &mio::event::Event, _ctx: &mut Ctx<'_, Self>) {
        let mut buf = [0u8; 64];
        while self.socket.recv(&mut buf).is_ok() {
            self.log.lock().unwrap().push("datagram");
        }
    }
    fn on_timer(&mut self, _timer: TimerId, _ctx: &mut Ctx<'_, Self>) {
        self.log.lock().unwrap().push("timer");
    }
}

/// A loop kept busy past a timer's deadline reads its sockets before the timer fires: what a
/// peer sent meanwhile is heard before a timer judges its silence (the driver's heartbeat
/// timeout and suspicion run on timers).
#[test]
fn a_loop_busy_past_a_timer_reads_its_sockets_before_the_timer_fires() {
    let rt = runtime(1);
    let log = Arc::new(Mutex::new(Vec::new()));
    let socket = mio::net::UdpSocket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let busy = Busy {
        socket,
        log: log.clone(),
    };
    let busy = rt.handle().spawn("busy", busy).unwrap();
    busy.send(Duration::from_millis(30)).unwrap();
    wait_until("the datagram and the timer", || {
        log.lock().unwrap().len() == 2
    });
    assert_eq!(*log.lock().unwrap(), ["datagram", "timer"]);
}

/// Blocks its loop until released, so the inbox fills.
struct Blocker {
    release: crossbeam_channel::Receiver<()>,
}

impl Endpoint for Blocker {
    type Msg = bool;
    fn on_message(&mut self, block: bool, _ctx: &mut Ctx<'_, Self>) {
        if block {
            let _ = self.release.recv_timeout(DEADLINE);
        }
    }
}

/// A one-loop runtime with an inbox of 4 whose loop is held inside a [`Blocker`]'s handler
/// until the sender is used: the inbox fills.
fn held_loop() -> (
    Runtime,
    flint_engine::runtime::EndpointRef<Blocker>,
    crossbeam_channel::Sender<()>,
) {
    let rt = Runtime::new(RuntimeConfig {
        threads: 1,
        inbox_capacity: 4,
        ..Default::default()
    })
    .unwrap();
    let (tx, rx) = crossbeam_channel::unbounded();
    let b = rt
        .handle()
        .spawn("blocker", Blocker { release: rx })
        .unwrap();
    b.send(true).unwrap();
    (rt, b, tx)
}

#[test]
fn full_inbox_rejects_or_applies_backpressure() {
    let (_rt, b, tx) = held_loop();
    let mut accepted = 0;
    wait_until("inbox full", || match b.send(false) {
        Ok(()) => {
            accepted += 1;
            false
        }
        Err(SendError::Full(_)) => true,
        Err(e) => panic!("unexpected {e}"),
    });
    assert!(accepted <= 5, "bounded: accepted {accepted}");
    let sender = {
        let b = b.clone();
        std::thread::spawn(move || b.send_timeout(false, DEADLINE).is_ok())
    };
    tx.send(()).unwrap();
    assert!(
        sender.join().unwrap(),
        "send_timeout succeeds once room appears"
    );
}

/// Holds its loop on a gate, or answers a ping.
enum GateMsg {
    /// Tells the first channel it holds the loop, then waits on the second.
    Hold(
        crossbeam_channel::Sender<()>,
        crossbeam_channel::Receiver<()>,
    ),
    Filler,
    Ping(Reply<u32>),
}

struct Gated;

impl Endpoint for Gated {
    type Msg = GateMsg;
    fn on_message(&mut self, msg: GateMsg, _ctx: &mut Ctx<'_, Self>) {
        match msg {
            GateMsg::Hold(held, gate) => {
                let _ = held.send(());
                let _ = gate.recv_timeout(DEADLINE);
            }
            GateMsg::Filler => {}
            GateMsg::Ping(reply) => {
                let _ = reply.send(7);
            }
        }
    }
}

/// The CI failure of `stress_many_producers_keep_per_sender_fifo`: an ask right after a burst
/// of sends found the inbox full and failed at once with `Full` although it had 10 s to wait.
#[test]
fn ask_into_a_full_inbox_waits_for_room_within_its_timeout() {
    let rt = Runtime::new(RuntimeConfig {
        threads: 1,
        inbox_capacity: 4,
        ..Default::default()
    })
    .unwrap();
    let g = rt.handle().spawn("gated", Gated).unwrap();
    let (open, gate) = crossbeam_channel::unbounded();
    let (held_tx, held) = crossbeam_channel::unbounded();
    g.send(GateMsg::Hold(held_tx, gate)).unwrap();
    held.recv_timeout(DEADLINE).expect("the loop holds");
    wait_until("inbox full", || {
        matches!(g.send(GateMsg::Filler), Err(SendError::Full(_)))
    });
    assert_eq!(
        g.ask(GateMsg::Ping, Duration::from_millis(20)).unwrap_err(),
        AskError::Full,
        "an ask whose timeout passes while the inbox stays full reports Full"
    );
    let (asking_tx, asking) = crossbeam_channel::unbounded();
    let asker = {
        let g = g.clone();
        std::thread::spawn(move || {
            asking_tx.send(()).unwrap();
            g.ask(GateMsg::Ping, DEADLINE)
        })
    };
    asking.recv_timeout(DEADLINE).unwrap();
    // The pause only gives the ask time to meet the full inbox (so the test catches an ask
    // that gives up at once); the ask passes however long it takes.
    std::thread::sleep(Duration::from_millis(50));
    open.send(()).unwrap();
    assert_eq!(asker.join().unwrap(), Ok(7), "the ask waited for room");
}

/// Asks another endpoint from inside its handler.
struct Asker {
    target: flint_engine::runtime::EndpointRef<Recorder>,
}

impl Endpoint for Asker {
    type Msg = Reply<Result<usize, AskError>>;
    fn on_message(&mut self, reply: Self::Msg, _ctx: &mut Ctx<'_, Self>) {
        let _ = reply.send(self.target.ask(RecMsg::Count, DEADLINE));
    }
}

#[test]
fn ask_from_a_handler_on_the_same_loop_is_refused_and_works_across_loops() {
    let rt = runtime(2);
    let (ep, _log) = recorder();
    let target = rt.handle().spawn_on(0, "target", ep).unwrap();
    let same = rt
        .handle()
        .spawn_on(
            0,
            "same",
            Asker {
                target: target.clone(),
            },
        )
        .unwrap();
    let other = rt.handle().spawn_on(1, "other", Asker { target }).unwrap();
    assert_eq!(same.ask(|r| r, DEADLINE).unwrap(), Err(AskError::SameLoop));
    assert_eq!(other.ask(|r| r, DEADLINE).unwrap(), Ok(1));
}

/// Counts the messages it handled before each `on_batch_end`.
struct Batcher {
    seen: usize,
    batch_ends: Arc<Mutex<Vec<usize>>>,
}

impl Endpoint for Batcher {
    type Msg = ();
    fn on_start(&mut self, ctx: &mut Ctx<'_, Self>) {
        // Queued on this loop's inbox, behind the spawn being handled: the same round drains
        // them.
        for _ in 0..5 {
            ctx.myself().send(()).expect("room");
        }
    }
    fn on_message(&mut self, _msg: (), _ctx: &mut Ctx<'_, Self>) {
        self.seen += 1;
    }
    fn on_batch_end(&mut self, _ctx: &mut Ctx<'_, Self>) {
        self.batch_ends.lock().unwrap().push(self.seen);
    }
}

#[test]
fn a_round_of_messages_ends_with_one_batch_end() {
    let rt = runtime(1);
    let batch_ends = Arc::new(Mutex::new(Vec::new()));
    let me = rt
        .handle()
        .spawn(
            "batcher",
            Batcher {
                seen: 0,
                batch_ends: batch_ends.clone(),
            },
        )
        .expect("spawn");
    wait_until("the first batch end", || {
        !batch_ends.lock().unwrap().is_empty()
    });
    assert_eq!(
        batch_ends.lock().unwrap()[0],
        5,
        "the start and its five messages were one round, with one batch end after them"
    );
    me.send(()).expect("room");
    wait_until("a batch end after the sixth message", || {
        batch_ends.lock().unwrap().last() == Some(&6)
    });
    let ends = batch_ends.lock().unwrap().clone();
    assert!(
        ends.windows(2).all(|w| w[0] < w[1]),
        "no batch end without a handler call before it: {ends:?}"
    );
    drop(rt);
}

/// Records the notices it gets, in order, beside its messages.
struct Noticed {
    log: Arc<Mutex<Vec<String>>>,
}

impl Endpoint for Noticed {
    type Msg = u32;
    fn on_message(&mut self, msg: u32, _ctx: &mut Ctx<'_, Self>) {
        self.log.lock().unwrap().push(format!("m{msg}"));
    }
    fn on_notify(&mut self, what: u32, _ctx: &mut Ctx<'_, Self>) {
        self.log.lock().unwrap().push(format!("n{what}"));
    }
}

#[test]
fn a_notice_reaches_on_notify_in_order_with_messages_and_fails_once_stopped() {
    let rt = runtime(1);
    let log = Arc::new(Mutex::new(Vec::new()));
    let r = rt
        .handle()
        .spawn("noticed", Noticed { log: log.clone() })
        .unwrap();
    r.send(1).unwrap();
    r.notify(7).unwrap();
    r.send(2).unwrap();
    r.notify(u32::MAX).unwrap();
    wait_until("four inputs", || log.lock().unwrap().len() == 4);
    assert_eq!(*log.lock().unwrap(), ["m1", "n7", "m2", "n4294967295"]);
    r.stop().unwrap();
    wait_until("stopped visible", || !r.is_alive());
    assert!(matches!(r.notify(3), Err(SendError::Stopped(3))));
}

#[test]
fn a_full_inbox_hands_the_notice_back() {
    let (_rt, b, tx) = held_loop();
    let mut accepted = 0;
    wait_until("inbox full", || match b.notify(9) {
        Ok(()) => {
            accepted += 1;
            false
        }
        Err(SendError::Full(what)) => {
            assert_eq!(what, 9, "the notice comes back");
            true
        }
        Err(e) => panic!("unexpected {e}"),
    });
    assert!(accepted <= 5, "bounded: accepted {accepted}");
    tx.send(()).unwrap();
    wait_until("room again", || b.notify(9).is_ok());
}
