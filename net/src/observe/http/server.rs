//! The IO thread of [`super::HttpServer`] and its workers (the bounds are in the module docs of
//! [`super`]). Each connection goes through [`Phase`]s: its head is read; a request without
//! the token is answered from bytes made at start, at the pace's time ([`Phase::Held`]); one
//! with the token waits for a worker ([`Phase::Work`]); the answer is written
//! ([`Phase::Write`]) and the connection closed. Deadlines are checked every [`SWEEP_US`]
//! while any connection is open; an idle server sleeps.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};

use super::head::{self, encode, form_value, Head, Method, Parsed, BODY_BYTES_MAX};
use super::pace::{AddrKey, Pace, Verdict};
use super::table::{Inserted, Table};
use super::{Access, HttpHandler, HttpLimits, Request, Response, Site, LOG_EVERY};
use crate::observe::token::COOKIE_NAME;

const LISTENER: Token = Token(0);
const WAKER: Token = Token(1);
/// Connection `slot` is token `slot + FIRST`.
const FIRST: usize = 2;
/// How often deadlines are checked while connections are open.
pub const SWEEP_US: u64 = 20_000;
/// How long a connection has been in before a newcomer over a cap may evict it (younger ones
/// make the newcomer be refused, which costs an accept and a close).
const EVICT_AGE_US: u64 = 100_000;
/// Connections accepted per round before the others get a turn.
const ACCEPTS_PER_ROUND: usize = 256;

/// Where a connection is.
enum Phase {
    /// Reading its head (and the login form's body).
    Head,
    /// A paced refusal: written at `at_us`, or the connection closed then without `bytes`.
    Held { at_us: u64, bytes: Option<Bytes> },
    /// Its request is with a worker until `until_us`.
    Work { until_us: u64 },
    /// Writing `out` until `until_us`.
    Write { until_us: u64 },
}

struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
    phase: Phase,
    accepted_us: u64,
    out: Bytes,
    sent: usize,
}

/// A request for a worker: `slot` and `seq` name the connection.
struct Work {
    slot: usize,
    seq: u64,
    request: Request,
    head_only: bool,
}

/// Workers' answers, picked up by the IO thread after its waker fires.
struct Answers {
    list: Mutex<Vec<(usize, u64, Bytes)>>,
    waker: Arc<Waker>,
}

/// What was dropped since the last log line.
#[derive(Default)]
struct Drops {
    evicted: u64,
    refused: u64,
    head_timeouts: u64,
    unanswered: u64,
    busy: u64,
    late: u64,
    write_timeouts: u64,
}

/// The answers made once at start.
struct Prepared {
    public: Vec<(&'static str, Bytes)>,
    login: Option<Bytes>,
    login_page: Option<Response>,
    unauthorized: Bytes,
}

pub(super) struct Server {
    poll: Poll,
    listener: TcpListener,
    table: Table<Conn>,
    pace: Pace,
    access: Access,
    limits: HttpLimits,
    prepared: Prepared,
    work: SyncSender<Work>,
    answers: Arc<Answers>,
    stop: Arc<AtomicBool>,
    epoch: Instant,
    accept_pending: bool,
    next_sweep_us: u64,
    drops: Drops,
    next_log_us: u64,
    /// The login cookie's name: with the port, so servers on one host keep their own.
    cookie_name: String,
}

fn unauthorized() -> Response {
    let mut response = Response::text(
        401,
        "a token is required: Authorization: Bearer TOKEN (the observe token)\n",
    );
    response.headers.push(("WWW-Authenticate", "Bearer".into()));
    response
}

impl Server {
    /// The server and its waker, its workers started.
    pub(super) fn new(
        mut listener: TcpListener,
        access: Access,
        limits: HttpLimits,
        site: Site,
        stop: Arc<AtomicBool>,
    ) -> io::Result<(Server, Arc<Waker>)> {
        let poll = Poll::new()?;
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
        let answers = Arc::new(Answers {
            list: Mutex::new(Vec::new()),
            waker: waker.clone(),
        });
        let work = start_workers(&limits, site.handler.clone(), &answers)?;
        let cookie_name = format!("{COOKIE_NAME}_{}", listener.local_addr()?.port());
        let prepared = Prepared {
            public: site
                .public
                .iter()
                .map(|(path, r)| (*path, Bytes::from(encode(r, false))))
                .collect(),
            login: site.login.as_ref().map(|r| Bytes::from(encode(r, false))),
            login_page: site.login,
            unauthorized: Bytes::from(encode(&unauthorized(), false)),
        };
        let server = Server {
            poll,
            listener,
            table: Table::new(limits.connections_max, limits.per_address_max, EVICT_AGE_US),
            pace: super::pace::Pace::new(limits.pace.clone()),
            access,
            limits,
            prepared,
            work,
            answers,
            stop,
            epoch: Instant::now(),
            accept_pending: false,
            next_sweep_us: 0,
            drops: Drops::default(),
            next_log_us: LOG_EVERY.as_micros() as u64,
            cookie_name,
        };
        Ok((server, waker))
    }

    fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }

    /// Serves until the stop flag is set.
    pub(super) fn run(mut self) {
        let mut events = Events::with_capacity(256);
        while !self.stop.load(Ordering::SeqCst) {
            let busy = !self.table.is_empty() || self.accept_pending;
            let timeout = busy.then_some(Duration::from_micros(SWEEP_US));
            if let Err(error) = self.poll.poll(&mut events, timeout) {
                if error.kind() != io::ErrorKind::Interrupted {
                    tracing::warn!("http: poll failed: {error}");
                    std::thread::sleep(Duration::from_millis(10));
                }
                continue;
            }
            let now = self.now_us();
            for event in events.iter() {
                match event.token() {
                    LISTENER => self.accept_all(now),
                    WAKER => {}
                    Token(t) => {
                        let readable = event.is_readable() || event.is_read_closed();
                        self.ready(t - FIRST, readable, event.is_writable(), now);
                    }
                }
            }
            self.take_answers(now);
            if self.accept_pending {
                self.accept_all(now);
            }
            if now >= self.next_sweep_us {
                self.sweep(now);
            }
            self.log_drops(now);
        }
    }

    // ----- connections in -----

    fn accept_all(&mut self, now: u64) {
        self.accept_pending = false;
        for _ in 0..ACCEPTS_PER_ROUND {
            match self.listener.accept() {
                Ok((stream, peer)) => self.admit(stream, peer.ip(), now),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => {
                    // Out of descriptors, most likely: free one and come back next round.
                    if self.table.evict_oldest().is_some() {
                        self.drops.evicted += 1;
                    }
                    tracing::debug!("http: accept failed: {error}");
                    self.accept_pending = true;
                    return;
                }
            }
        }
        self.accept_pending = true;
    }

    fn admit(&mut self, stream: TcpStream, ip: IpAddr, now: u64) {
        // (No TCP_NODELAY: every answer goes out in one write, then the connection closes.)
        let conn = Conn {
            stream,
            buf: Vec::new(),
            phase: Phase::Head,
            accepted_us: now,
            out: Bytes::new(),
            sent: 0,
        };
        let slot = match self.table.insert(AddrKey::of(ip), conn, now) {
            Inserted::Refused(_) => {
                self.drops.refused += 1;
                return;
            }
            Inserted::At { slot, evicted, .. } => {
                self.drops.evicted += evicted.len() as u64;
                slot
            }
        };
        let registry = self.poll.registry();
        let Some(entry) = self.table.get_mut(slot) else {
            return;
        };
        let interest = Interest::READABLE | Interest::WRITABLE;
        if registry
            .register(&mut entry.conn.stream, Token(slot + FIRST), interest)
            .is_err()
        {
            self.table.remove(slot);
            return;
        }
        // The head is often there already.
        self.read(slot, now);
    }

    fn ready(&mut self, slot: usize, readable: bool, writable: bool, now: u64) {
        let Some(entry) = self.table.get_mut(slot) else {
            return;
        };
        match entry.conn.phase {
            Phase::Head if readable => self.read(slot, now),
            Phase::Write { .. } if writable => self.write(slot),
            _ => {}
        }
    }

    /// Reads what there is of the head (and body), then looks at it.
    fn read(&mut self, slot: usize, now: u64) {
        let limit = self.limits.head_bytes_max + BODY_BYTES_MAX;
        let Some(entry) = self.table.get_mut(slot) else {
            return;
        };
        if !fill(&mut entry.conn, limit) {
            self.table.remove(slot);
            return;
        }
        self.look(slot, now);
    }

    /// Decides on a connection's bytes once they make a whole request (or a bad one).
    fn look(&mut self, slot: usize, now: u64) {
        let head_max = self.limits.head_bytes_max;
        let Some(entry) = self.table.get_mut(slot) else {
            return;
        };
        let key = entry.key;
        let buf = &entry.conn.buf;
        match head::parse(buf, head_max, &self.cookie_name) {
            Parsed::Partial => {}
            Parsed::Bad(status, text) => {
                let bytes = Bytes::from(encode(&Response::text(status, text), false));
                self.refuse(slot, key, bytes, now);
            }
            Parsed::Complete(head) => {
                let end = head.head_len + head.body_len;
                if buf.len() >= end {
                    let body = buf[head.head_len..end].to_vec();
                    self.decide(slot, key, head, &body, now);
                } // else the body is on its way
            }
        }
    }

    // ----- deciding -----

    fn decide(&mut self, slot: usize, key: AddrKey, head: Head, body: &[u8], now: u64) {
        if head.method == Method::Post && head.request.path == "/login" {
            let bytes = self.login(&head, body);
            return self.refuse(slot, key, bytes, now);
        }
        let shows_token = self.shows_token(&head);
        let public = self
            .prepared
            .public
            .iter()
            .find(|(p, _)| *p == head.request.path);
        match public {
            Some((_, bytes)) if head.method == Method::Get && shows_token => {
                return self.answer(slot, bytes.clone(), now);
            }
            _ if !shows_token => {
                let bytes = self.refusal(&head);
                return self.refuse(slot, key, bytes, now);
            }
            _ => {}
        }
        if !matches!(head.method, Method::Get | Method::Head) {
            let answer = Response::text(405, "GET only: this server is read-only\n");
            self.table.keep(slot);
            return self.answer(slot, Bytes::from(encode(&answer, false)), now);
        }
        self.dispatch(slot, head.request, head.method == Method::Head, now);
    }

    fn shows_token(&self, head: &Head) -> bool {
        match &self.access {
            Access::Open => true,
            Access::Token(token) => {
                head.bearer.as_deref().is_some_and(|b| token.matches(b))
                    || head
                        .cookie
                        .as_deref()
                        .is_some_and(|c| token.matches_cookie(c))
            }
        }
    }

    /// What a request without the token gets: a public answer, the login page, or a `401`.
    fn refusal(&self, head: &Head) -> Bytes {
        let get = head.method == Method::Get;
        let public = self
            .prepared
            .public
            .iter()
            .find(|(p, _)| *p == head.request.path);
        match (public, &self.prepared.login) {
            (Some((_, bytes)), _) if get => bytes.clone(),
            (_, Some(login)) if get && head.wants_html => login.clone(),
            _ => self.prepared.unauthorized.clone(),
        }
    }

    /// `POST /login`: the form's token right sets the cookie and goes to the form's `next`.
    fn login(&self, head: &Head, body: &[u8]) -> Bytes {
        let next = form_value(body, "next")
            .and_then(|n| String::from_utf8(n).ok())
            .filter(|n| local_path(n))
            .unwrap_or_else(|| "/".to_owned());
        let given = form_value(body, "token").unwrap_or_default();
        let cookie = match &self.access {
            Access::Token(token) if token.matches(given.trim_ascii()) => Some(token.cookie()),
            Access::Token(_) => None,
            Access::Open => Some(""),
        };
        let Some(cookie) = cookie else {
            return match (&self.prepared.login_page, head.wants_html) {
                (Some(page), true) => Bytes::from(encode(page, false)),
                _ => self.prepared.unauthorized.clone(),
            };
        };
        let mut answer = Response::text(303, "logged in\n");
        answer.headers.push(("Location", next));
        if !cookie.is_empty() {
            let name = &self.cookie_name;
            let set = format!("{name}={cookie}; Path=/; HttpOnly; SameSite=Strict");
            answer.headers.push(("Set-Cookie", set));
        }
        Bytes::from(encode(&answer, false))
    }

    /// A refusal, at the pace's time.
    fn refuse(&mut self, slot: usize, key: AddrKey, bytes: Bytes, now: u64) {
        match self.pace.refuse(key, now) {
            Verdict::AnswerAt(at) if at <= now => self.answer(slot, bytes, now),
            verdict => {
                let (at_us, bytes) = match verdict {
                    Verdict::AnswerAt(at) => (at, Some(bytes)),
                    Verdict::DropAt(at) => {
                        self.drops.unanswered += 1;
                        (at, None)
                    }
                };
                if let Some(entry) = self.table.get_mut(slot) {
                    entry.conn.phase = Phase::Held { at_us, bytes };
                    entry.conn.buf = Vec::new();
                }
            }
        }
    }

    /// Hands a request that showed the token to a worker (`503` when they are all busy).
    fn dispatch(&mut self, slot: usize, request: Request, head_only: bool, now: u64) {
        self.table.keep(slot);
        let Some(entry) = self.table.get_mut(slot) else {
            return;
        };
        let work = Work {
            slot,
            seq: entry.seq,
            request,
            head_only,
        };
        if self.work.try_send(work).is_ok() {
            entry.conn.phase = Phase::Work {
                until_us: now + self.limits.answer_timeout.as_micros() as u64,
            };
            entry.conn.buf = Vec::new();
        } else {
            self.drops.busy += 1;
            let busy = Response::text(503, "busy: try again\n");
            self.answer(slot, Bytes::from(encode(&busy, head_only)), now);
        }
    }

    // ----- answers out -----

    fn take_answers(&mut self, now: u64) {
        let answers = std::mem::take(&mut *lock(&self.answers.list));
        for (slot, seq, bytes) in answers {
            let current = self.table.get_mut(slot).is_some_and(|entry| {
                entry.seq == seq && matches!(entry.conn.phase, Phase::Work { .. })
            });
            if current {
                self.answer(slot, bytes, now);
            }
        }
    }

    fn answer(&mut self, slot: usize, bytes: Bytes, now: u64) {
        let until_us = now + self.limits.write_timeout.as_micros() as u64;
        let Some(entry) = self.table.get_mut(slot) else {
            return;
        };
        entry.conn.phase = Phase::Write { until_us };
        entry.conn.out = bytes;
        entry.conn.sent = 0;
        entry.conn.buf = Vec::new();
        self.write(slot);
    }

    /// Writes what it can; closes the connection once all is out.
    fn write(&mut self, slot: usize) {
        let Some(entry) = self.table.get_mut(slot) else {
            return;
        };
        let conn = &mut entry.conn;
        while conn.sent < conn.out.len() {
            match conn.stream.write(&conn.out[conn.sent..]) {
                Ok(0) => break,
                Ok(n) => conn.sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        let _ = conn.stream.flush();
        let _ = conn.stream.shutdown(Shutdown::Write);
        self.table.remove(slot);
    }

    /// Deadlines: heads not in, held refusals due, workers late, writes stuck.
    fn sweep(&mut self, now: u64) {
        self.next_sweep_us = now + SWEEP_US;
        let head_timeout = self.limits.head_timeout.as_micros() as u64;
        for slot in 0..self.table.capacity() {
            let Some(entry) = self.table.get_mut(slot) else {
                continue;
            };
            let conn = &mut entry.conn;
            let due = match &mut conn.phase {
                Phase::Head => now >= conn.accepted_us + head_timeout,
                Phase::Held { at_us, .. } => now >= *at_us,
                Phase::Work { until_us } | Phase::Write { until_us } => now >= *until_us,
            };
            if !due {
                continue;
            }
            match std::mem::replace(&mut conn.phase, Phase::Head) {
                Phase::Held {
                    bytes: Some(bytes), ..
                } => self.answer(slot, bytes, now),
                Phase::Work { .. } => {
                    self.drops.late += 1;
                    let late = Response::text(503, "no answer in time\n");
                    self.answer(slot, Bytes::from(encode(&late, false)), now);
                }
                phase => {
                    match phase {
                        Phase::Head => self.drops.head_timeouts += 1,
                        Phase::Write { .. } => self.drops.write_timeouts += 1,
                        _ => {}
                    }
                    self.table.remove(slot);
                }
            }
        }
    }

    fn log_drops(&mut self, now: u64) {
        if now < self.next_log_us {
            return;
        }
        self.next_log_us = now + LOG_EVERY.as_micros() as u64;
        let d = std::mem::take(&mut self.drops);
        let total = d.evicted
            + d.refused
            + d.head_timeouts
            + d.unanswered
            + d.busy
            + d.late
            + d.write_timeouts;
        if total > 0 {
            tracing::warn!(
                evicted = d.evicted,
                refused_table_full = d.refused,
                head_timeouts = d.head_timeouts,
                refusals_unanswered = d.unanswered,
                busy = d.busy,
                answers_late = d.late,
                write_timeouts = d.write_timeouts,
                "http: connections dropped in the last {} s",
                LOG_EVERY.as_secs()
            );
        }
    }
}

/// Reads into the connection's buffer up to `limit` bytes or until the socket has no more;
/// false when the client closed or the socket failed.
fn fill(conn: &mut Conn, limit: usize) -> bool {
    let mut chunk = [0u8; 4096];
    while conn.buf.len() < limit {
        let room = (limit - conn.buf.len()).min(chunk.len());
        match conn.stream.read(&mut chunk[..room]) {
            Ok(0) => return false,
            Ok(n) => conn.buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
    true
}

/// A `next` the login may send a browser to: a path on this server, never another origin.
fn local_path(next: &str) -> bool {
    next.starts_with('/')
        && !next.starts_with("//")
        && next.len() <= 512
        && next
            .bytes()
            .all(|b| (0x21..=0x7e).contains(&b) && b != b'\\')
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Starts the workers; their queue's sending side.
fn start_workers(
    limits: &HttpLimits,
    handler: HttpHandler,
    answers: &Arc<Answers>,
) -> io::Result<SyncSender<Work>> {
    let (tx, rx) = sync_channel::<Work>(limits.queue_max);
    let rx = Arc::new(Mutex::new(rx));
    for i in 0..limits.workers {
        let (rx, handler, answers) = (rx.clone(), handler.clone(), answers.clone());
        std::thread::Builder::new()
            .name(format!("flint-http-work-{i}"))
            .spawn(move || work(&rx, &handler, &answers))?;
    }
    Ok(tx)
}

/// A worker: answers requests until the IO thread is gone.
fn work(rx: &Mutex<Receiver<Work>>, handler: &HttpHandler, answers: &Answers) {
    loop {
        let next = lock(rx).recv();
        let Ok(work) = next else {
            return;
        };
        let answer =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handler(&work.request)))
                .unwrap_or_else(|_| Response::text(500, "the handler failed\n"));
        let bytes = Bytes::from(encode(&answer, work.head_only));
        lock(&answers.list).push((work.slot, work.seq, bytes));
        let _ = answers.waker.wake();
    }
}
