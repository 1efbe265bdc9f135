//! The HTTP server for the metrics, the pages and the JSON API: one request per connection
//! (`Connection: close`), `GET`/`HEAD` and the login form's `POST`, built so that a slow or
//! hostile client cannot stall it and costs the process little.
//!
//! One IO thread (`flint-http`) runs every connection on `mio`, never blocking: it parses heads
//! with `httparse` ([`head`]), answers what needs no work itself, and hands requests that showed
//! the token to a few worker threads (`flint-http-work`, [`HttpLimits::workers`]), whose answers
//! it writes. Nothing here runs on a role's loop: a handler that needs the driver asks it one
//! message (and the pages share one answer for a while, see [`super::ui`]).
//!
//! Bounds, each a field of [`HttpLimits`]:
//! - a whole request head (and the login form's body) within `head_timeout` of the accept, else
//!   the connection is closed: a client sending a byte a second holds a slot that long at most;
//! - at most `connections_max` connections, at most `per_address_max` from one client (an IPv4
//!   address, an IPv6 /64); a newcomer over either cap evicts the oldest connection that has not
//!   shown a request worth keeping and is at least 100 ms old, else it is refused (see
//!   [`table`]): held connections cannot keep a newer one out for long, a client reconnecting in
//!   a loop costs an accept and a close each time, and descriptors run out last (clients behind
//!   one address share its connections: under such a loop from their address, they are kept out
//!   too);
//! - requests without the token are refused without a thread, a buffer copy or a look at the
//!   role, and at a pace ([`pace`]): a client's first few at once, then a few a second, the
//!   rest held and closed unanswered, so a client looping on them waits instead of spinning;
//! - heads of at most `head_bytes_max` bytes (`431`), bodies of at most [`head::BODY_BYTES_MAX`];
//! - at most `queue_max` requests waiting for a worker (then `503`), an answer within
//!   `answer_timeout` (then `503`), and written within `write_timeout` (then closed).
//!
//! Every eviction, timeout and unanswered refusal is counted and logged once per
//! [`LOG_EVERY`] as one warning with the counts.
//!
//! Access ([`Access`]): with a token, a request shows it as `Authorization: Bearer TOKEN` or as
//! the login cookie `POST /login` sets (see [`super::token`]); tokens in URLs are not accepted.
//! [`Access::Open`] serves loopback addresses only.

#[doc(hidden)]
pub mod flood;
pub mod head;
pub mod pace;
mod server;
pub mod table;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

pub use super::token::Access;
use pace::PaceLimits;

/// How often the counts of dropped connections are logged (when there are any).
pub const LOG_EVERY: Duration = Duration::from_secs(10);

/// The server's bounds (see the module docs).
#[derive(Debug, Clone)]
pub struct HttpLimits {
    /// Connections open at once.
    pub connections_max: usize,
    /// Connections open at once from one client.
    pub per_address_max: usize,
    /// Bytes of a request head.
    pub head_bytes_max: usize,
    /// Time from the accept to the whole request head (and body).
    pub head_timeout: Duration,
    /// Time a worker has to answer.
    pub answer_timeout: Duration,
    /// Time to write the answer out.
    pub write_timeout: Duration,
    /// Threads answering requests that showed the token.
    pub workers: usize,
    /// Requests waiting for a worker.
    pub queue_max: usize,
    /// The pace of refusals.
    pub pace: PaceLimits,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            connections_max: 1024,
            per_address_max: 32,
            head_bytes_max: 8 * 1024,
            head_timeout: Duration::from_millis(1500),
            answer_timeout: Duration::from_secs(5),
            write_timeout: Duration::from_secs(5),
            workers: 2,
            queue_max: 64,
            pace: PaceLimits::default(),
        }
    }
}

/// A request as a handler sees it.
#[derive(Debug, Clone, Default)]
pub struct Request {
    /// The path, without the query.
    pub path: String,
    /// The query's `key=value` pairs, undecoded.
    pub query: Vec<(String, String)>,
    /// The `Accept` header, if any.
    pub accept: Option<String>,
}

impl Request {
    /// The value of a query parameter.
    pub fn param(&self, key: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// An answer.
#[derive(Debug, Clone)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// Its `Content-Type`.
    pub content_type: &'static str,
    /// The body.
    pub body: Vec<u8>,
    /// Headers besides the ones every answer carries (see [`head::encode`]).
    pub headers: Vec<(&'static str, String)>,
}

impl Response {
    /// A `200` with this type and body.
    pub fn ok(content_type: &'static str, body: impl Into<Vec<u8>>) -> Response {
        Response {
            status: 200,
            content_type,
            body: body.into(),
            headers: Vec::new(),
        }
    }

    /// A plain-text answer with this status.
    pub fn text(status: u16, body: impl Into<String>) -> Response {
        Response {
            status,
            content_type: "text/plain; charset=utf-8",
            body: body.into().into_bytes(),
            headers: Vec::new(),
        }
    }
}

/// What answers requests that showed the token.
pub type HttpHandler = Arc<dyn Fn(&Request) -> Response + Send + Sync>;

/// What a server answers.
#[derive(Clone)]
pub struct Site {
    /// Answers requests that showed the token (every request with [`Access::Open`]).
    pub handler: HttpHandler,
    /// Answers anyone gets by path (paced as refusals are): the login page's script, say.
    pub public: Vec<(&'static str, Response)>,
    /// What a browser without the token gets (status `401`): a page that logs it in.
    pub login: Option<Response>,
}

impl Site {
    /// A site of one handler, nothing public.
    pub fn handler(handler: HttpHandler) -> Site {
        Site {
            handler,
            public: Vec::new(),
            login: None,
        }
    }
}

/// A running server; stops when dropped (or [`HttpServer::stop`]).
pub struct HttpServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    waker: Arc<mio::Waker>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for HttpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpServer")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

/// Why an [`HttpServer`] could not start.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// A non-loopback address with [`Access::Open`].
    #[error("refusing to serve HTTP on non-loopback {0} without a token: give an observe token")]
    InsecureBind(SocketAddr),
    /// The address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// What the operating system said.
        source: std::io::Error,
    },
    /// The poller, the bound listener's address or a thread could not be had.
    #[error("cannot start the HTTP server: {0}")]
    Start(std::io::Error),
}

impl HttpServer {
    /// Binds `addr` and serves `site` to those `access` lets in, within `limits`. With
    /// [`Access::Open`] only a loopback address is accepted.
    pub fn start(
        addr: SocketAddr,
        access: Access,
        limits: HttpLimits,
        site: Site,
    ) -> Result<HttpServer, HttpError> {
        if !addr.ip().is_loopback() && matches!(access, Access::Open) {
            return Err(HttpError::InsecureBind(addr));
        }
        assert!(limits.workers > 0 && limits.queue_max > 0);
        let listener = listen(addr).map_err(|source| HttpError::Listen { addr, source })?;
        let addr = listener.local_addr().map_err(HttpError::Start)?;
        let stop = Arc::new(AtomicBool::new(false));
        let (server, waker) = server::Server::new(listener, access, limits, site, stop.clone())
            .map_err(HttpError::Start)?;
        let thread = std::thread::Builder::new()
            .name("flint-http".into())
            .spawn(move || server.run())
            .map_err(HttpError::Start)?;
        Ok(HttpServer {
            addr,
            stop,
            waker,
            thread: Some(thread),
        })
    }

    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops serving (open connections are closed) and waits for the IO thread.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.waker.wake();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Connections the kernel keeps waiting for an accept (Linux caps it at `somaxconn`, 4096 by
/// default): a burst of connections beyond it has its SYNs dropped, and a client waits a
/// second to send its SYN again.
pub const BACKLOG: i32 = 4096;

/// A non-blocking listener on `addr` with [`BACKLOG`].
fn listen(addr: SocketAddr) -> std::io::Result<mio::net::TcpListener> {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    Ok(mio::net::TcpListener::from_std(socket.into()))
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}
