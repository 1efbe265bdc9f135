//! The attacks the HTTP server is tested and measured against, over raw sockets from chosen
//! loopback addresses (a test tool: `#[doc(hidden)]`): [`slow_headers`] (connections sending a
//! head a byte at a time, reopened when closed), [`held`] (connections opened and held silent,
//! reopened when closed), [`unauthenticated`] (threads looping on requests without the token),
//! and [`request`], the good client, which says how long its answer took. Every attack stops
//! when its [`Flood`] is stopped or dropped, and by itself after [`FLOOD_MAX`].

use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use socket2::{Domain, Socket, Type};

/// The longest any attack runs.
pub const FLOOD_MAX: Duration = Duration::from_secs(120);

/// A TCP connection from `from` (an address of this machine) to `to`.
pub fn connect_from(from: IpAddr, to: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    let socket = Socket::new(Domain::for_address(to), Type::STREAM, None)?;
    socket.bind(&SocketAddr::new(from, 0).into())?;
    socket.connect_timeout(&to.into(), timeout)?;
    Ok(socket.into())
}

/// An answer and how long it took from the connect.
#[derive(Debug, Clone)]
pub struct Answer {
    /// Its status (0 when none could be read).
    pub status: u16,
    /// Its head.
    pub head: String,
    /// Its body.
    pub body: Vec<u8>,
    /// From before the connect to the end of the answer.
    pub took: Duration,
}

impl Answer {
    /// The value of a header in the head.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().find_map(|line| {
            let (n, v) = line.split_once(':')?;
            n.trim().eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Sends `raw` from `from` and reads the answer to its end, within `timeout`.
pub fn request(from: IpAddr, to: SocketAddr, raw: &[u8], timeout: Duration) -> io::Result<Answer> {
    let started = Instant::now();
    let mut stream = connect_from(from, to, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    stream.write_all(raw)?;
    let mut bytes = Vec::new();
    stream.read_to_end(&mut bytes)?;
    let took = started.elapsed();
    let split = bytes.windows(4).position(|w| w == b"\r\n\r\n");
    let (head, body) = match split {
        Some(at) => (&bytes[..at], bytes[at + 4..].to_vec()),
        None => (&bytes[..], Vec::new()),
    };
    let head = String::from_utf8_lossy(head).into_owned();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Ok(Answer {
        status,
        head,
        body,
        took,
    })
}

/// `GET path` with the token as a bearer credential, if given.
pub fn get(
    from: IpAddr,
    to: SocketAddr,
    path: &str,
    bearer: Option<&str>,
    timeout: Duration,
) -> io::Result<Answer> {
    let auth = bearer.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let raw = format!("GET {path} HTTP/1.1\r\nHost: flint\r\n{auth}\r\n");
    request(from, to, raw.as_bytes(), timeout)
}

/// What an attack did.
#[derive(Debug, Clone, Copy, Default)]
pub struct FloodStats {
    /// Connections it opened.
    pub connections: u64,
    /// Answers it read (any status).
    pub answers: u64,
    /// Its connections the server closed.
    pub closed: u64,
}

#[derive(Default)]
struct Counts {
    connections: AtomicU64,
    answers: AtomicU64,
    closed: AtomicU64,
}

/// A running attack; stops when dropped.
pub struct Flood {
    stop: Arc<AtomicBool>,
    counts: Arc<Counts>,
    threads: Vec<JoinHandle<()>>,
}

impl Flood {
    fn start(
        threads: usize,
        body: impl Fn(usize, &AtomicBool, &Counts) + Send + Sync + 'static,
    ) -> Flood {
        let stop = Arc::new(AtomicBool::new(false));
        let counts = Arc::new(Counts::default());
        let body = Arc::new(body);
        let handles = (0..threads)
            .map(|i| {
                let (stop, counts, body) = (stop.clone(), counts.clone(), body.clone());
                std::thread::spawn(move || body(i, &stop, &counts))
            })
            .collect();
        Flood {
            stop,
            counts,
            threads: handles,
        }
    }

    /// What it did so far.
    pub fn stats(&self) -> FloodStats {
        FloodStats {
            connections: self.counts.connections.load(Ordering::Relaxed),
            answers: self.counts.answers.load(Ordering::Relaxed),
            closed: self.counts.closed.load(Ordering::Relaxed),
        }
    }

    /// Stops it; what it did.
    pub fn stop(mut self) -> FloodStats {
        self.halt();
        self.stats()
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        self.halt();
    }
}

fn running(stop: &AtomicBool, started: Instant) -> bool {
    !stop.load(Ordering::Relaxed) && started.elapsed() < FLOOD_MAX
}

/// Whether the server closed `stream` (non-blocking peek).
fn closed(stream: &TcpStream) -> bool {
    let mut byte = [0u8; 1];
    match stream.peek(&mut byte) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != io::ErrorKind::WouldBlock,
    }
}

/// Keeps `count` connections from the addresses `from` (round robin) open to `to`, each sent
/// `greeting` when opened and `feed` every `every`, reopening those the server closes.
fn keep_open(
    from: Vec<IpAddr>,
    to: SocketAddr,
    count: usize,
    every: Duration,
    (greeting, feed): (&'static [u8], &'static [u8]),
) -> Flood {
    Flood::start(1, move |_, stop, counts| {
        let started = Instant::now();
        let open = |i: usize| {
            let mut stream =
                connect_from(from[i % from.len()], to, Duration::from_millis(500)).ok()?;
            stream.write_all(greeting).ok()?;
            stream.set_nonblocking(true).ok()?;
            counts.connections.fetch_add(1, Ordering::Relaxed);
            Some(stream)
        };
        let mut conns: Vec<Option<TcpStream>> = Vec::with_capacity(count);
        while conns.len() < count && running(stop, started) {
            conns.push(open(conns.len()));
        }
        while running(stop, started) {
            for (i, slot) in conns.iter_mut().enumerate() {
                let alive = slot
                    .as_mut()
                    .is_some_and(|s| !closed(s) && (feed.is_empty() || s.write(feed).is_ok()));
                if !alive {
                    counts
                        .closed
                        .fetch_add(u64::from(slot.is_some()), Ordering::Relaxed);
                    *slot = open(i);
                }
                if stop.load(Ordering::Relaxed) {
                    return;
                }
            }
            std::thread::sleep(every);
        }
    })
}

/// `count` connections sending a request head one byte every `every`, never finishing it.
pub fn slow_headers(from: Vec<IpAddr>, to: SocketAddr, count: usize, every: Duration) -> Flood {
    // The head never ends: a header line, a byte at a time.
    keep_open(
        from,
        to,
        count,
        every,
        (b"GET / HTTP/1.1\r\nX-Slow: ", b"a"),
    )
}

/// `count` connections opened and held silent.
pub fn held(from: Vec<IpAddr>, to: SocketAddr, count: usize) -> Flood {
    keep_open(from, to, count, Duration::from_millis(50), (b"", b""))
}

/// `threads` threads, each sending requests without the token from `from` one after another.
pub fn unauthenticated(from: IpAddr, to: SocketAddr, threads: usize) -> Flood {
    Flood::start(threads, move |_, stop, counts| {
        let started = Instant::now();
        while running(stop, started) {
            counts.connections.fetch_add(1, Ordering::Relaxed);
            match get(from, to, "/metrics", None, Duration::from_secs(5)) {
                Ok(answer) if answer.status != 0 => {
                    counts.answers.fetch_add(1, Ordering::Relaxed);
                }
                _ => {
                    counts.closed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    })
}
