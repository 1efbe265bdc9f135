//! A minimal, bounded HTTP/1.1 responder for the metrics and the web UI: `GET` only, one
//! request per connection (`Connection: close`), on threads of its own (never the roles' loops).
//!
//! Bounded: at most [`HttpLimits::connections_max`] connections are served at once (more are
//! answered `503` and closed), a request head may be at most [`HttpLimits::request_bytes_max`]
//! bytes (more: `431`), and each connection has [`HttpLimits::timeout`] to send its request and
//! read the answer (socket timeouts on both directions, and a deadline over the whole read).
//!
//! Secure by default: given a [`Secret`], every request must carry it as a token, in the query
//! (`?token=SECRET`) or a header (`Authorization: Bearer SECRET`), compared in constant time;
//! otherwise `401`. The token is never logged or echoed.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::handshake::Secret;

/// The responder's bounds.
#[derive(Debug, Clone)]
pub struct HttpLimits {
    /// Connections served at once.
    pub connections_max: usize,
    /// Bytes of a request head (request line and headers).
    pub request_bytes_max: usize,
    /// Time a connection has to send its request, and to take the answer.
    pub timeout: Duration,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            connections_max: 16,
            request_bytes_max: 8 * 1024,
            timeout: Duration::from_secs(5),
        }
    }
}

/// A request as the handler sees it (the token already checked and removed).
#[derive(Debug, Clone)]
pub struct Request {
    /// The path, without the query.
    pub path: String,
    /// The query's `key=value` pairs, `token` left out, undecoded.
    pub query: Vec<(String, String)>,
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
}

impl Response {
    /// A `200` with this type and body.
    pub fn ok(content_type: &'static str, body: impl Into<Vec<u8>>) -> Response {
        Response {
            status: 200,
            content_type,
            body: body.into(),
        }
    }

    /// A plain-text answer with this status.
    pub fn text(status: u16, body: impl Into<String>) -> Response {
        Response {
            status,
            content_type: "text/plain; charset=utf-8",
            body: body.into().into_bytes(),
        }
    }
}

/// What answers requests.
pub type Handler = Arc<dyn Fn(&Request) -> Response + Send + Sync>;

/// A running responder; stops when dropped (or [`HttpServer::stop`]).
pub struct HttpServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
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
    /// A non-loopback address without a secret, and `allow_insecure_bind` not set.
    #[error("refusing to serve HTTP on non-loopback {0} without a shared secret")]
    InsecureBind(SocketAddr),
    /// The address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// What the operating system said.
        source: std::io::Error,
    },
    /// The bound listener has no local address.
    #[error("{0}")]
    LocalAddr(std::io::Error),
    /// The accepting thread could not be started.
    #[error("cannot start the HTTP thread: {0}")]
    Thread(std::io::Error),
}

impl HttpServer {
    /// Binds `addr` and serves `handler` on a thread of its own. Without a `secret` a
    /// non-loopback address is refused unless `allow_insecure_bind`.
    pub fn start(
        addr: SocketAddr,
        secret: Option<Secret>,
        allow_insecure_bind: bool,
        limits: HttpLimits,
        handler: Handler,
    ) -> Result<HttpServer, HttpError> {
        if !addr.ip().is_loopback() && secret.is_none() && !allow_insecure_bind {
            return Err(HttpError::InsecureBind(addr));
        }
        let listener =
            TcpListener::bind(addr).map_err(|source| HttpError::Listen { addr, source })?;
        let addr = listener.local_addr().map_err(HttpError::LocalAddr)?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("flint-http".into())
            .spawn(move || accept_loop(listener, secret, limits, handler, flag))
            .map_err(HttpError::Thread)?;
        Ok(HttpServer {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting and waits for the accepting thread.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the blocking accept.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn accept_loop(
    listener: TcpListener,
    secret: Option<Secret>,
    limits: HttpLimits,
    handler: Handler,
    stop: Arc<AtomicBool>,
) {
    let active = Arc::new(AtomicUsize::new(0));
    let secret = Arc::new(secret);
    for stream in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let mut stream = match stream {
            Ok(stream) => stream,
            Err(error) => {
                tracing::debug!("http accept failed: {error}");
                // Out of descriptors or similar: do not spin.
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        let _ = stream.set_write_timeout(Some(limits.timeout));
        if active.fetch_add(1, Ordering::SeqCst) >= limits.connections_max {
            active.fetch_sub(1, Ordering::SeqCst);
            tracing::debug!("http: too many connections, answered 503");
            let _ = write_response(&mut stream, &Response::text(503, "too many connections\n"));
            continue;
        }
        let (active, secret, handler, limits) = (
            active.clone(),
            secret.clone(),
            handler.clone(),
            limits.clone(),
        );
        let spawned = std::thread::Builder::new()
            .name("flint-http-conn".into())
            .spawn(move || {
                serve_one(stream, &secret, &limits, &handler);
                active.fetch_sub(1, Ordering::SeqCst);
            });
        if let Err(error) = spawned {
            tracing::warn!("http: cannot start a connection thread: {error}");
        }
    }
}

fn serve_one(
    mut stream: TcpStream,
    secret: &Option<Secret>,
    limits: &HttpLimits,
    handler: &Handler,
) {
    let response = match read_head(&mut stream, limits) {
        Ok(head) => answer(&head, secret, handler),
        Err(HeadError::TooLarge) => Response::text(431, "request too large\n"),
        Err(HeadError::Bad) => Response::text(400, "bad request\n"),
        Err(HeadError::Io) => return,
    };
    let _ = write_response(&mut stream, &response);
    let _ = stream.shutdown(Shutdown::Both);
}

enum HeadError {
    TooLarge,
    Bad,
    Io,
}

/// Reads up to the blank line ending the head, within the size and the deadline.
fn read_head(stream: &mut TcpStream, limits: &HttpLimits) -> Result<String, HeadError> {
    let deadline = Instant::now() + limits.timeout;
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        if let Some(end) = find_head_end(&buf) {
            buf.truncate(end);
            return String::from_utf8(buf).map_err(|_| HeadError::Bad);
        }
        if buf.len() > limits.request_bytes_max {
            return Err(HeadError::TooLarge);
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(HeadError::Io);
        }
        if stream.set_read_timeout(Some(remaining)).is_err() {
            return Err(HeadError::Io);
        }
        match stream.read(&mut chunk) {
            Ok(0) => {
                return Err(if buf.is_empty() {
                    HeadError::Io
                } else {
                    HeadError::Bad
                })
            }
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return Err(HeadError::Io),
        }
    }
}

fn find_head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n")
}

/// Equal in time independent of where the bytes differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Decodes `%XX` and `+` in a query value.
fn percent_decode(s: &str) -> Vec<u8> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    None => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    out
}

fn answer(head: &str, secret: &Option<Secret>, handler: &Handler) -> Response {
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or("");
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next())
    else {
        return Response::text(400, "bad request line\n");
    };
    if !version.starts_with("HTTP/1.") {
        return Response::text(505, "HTTP/1.x only\n");
    }
    if method != "GET" && method != "HEAD" {
        return Response::text(405, "GET only: this server is read-only\n");
    }
    let mut bearer: Option<&str> = None;
    for line in lines {
        if let Some((name, value)) = line.split_once(':') {
            if name.trim().eq_ignore_ascii_case("authorization") {
                let value = value.trim();
                if let Some(token) = value
                    .strip_prefix("Bearer ")
                    .or_else(|| value.strip_prefix("bearer "))
                {
                    bearer = Some(token.trim());
                }
            }
        }
    }
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let mut token: Option<Vec<u8>> = bearer.map(|b| b.as_bytes().to_vec());
    let mut pairs = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if k == "token" {
            token.get_or_insert_with(|| percent_decode(v));
        } else {
            pairs.push((k.to_owned(), v.to_owned()));
        }
    }
    if let Some(secret) = secret {
        let expected = secret.expose_bytes();
        let given = token.unwrap_or_default();
        // Secret files may end with a newline the token does not carry.
        let trimmed = expected.strip_suffix(b"\n").unwrap_or(expected);
        if !(constant_time_eq(&given, expected) || constant_time_eq(&given, trimmed)) {
            return Response::text(
                401,
                "a token is required: ?token=SECRET or Authorization: Bearer SECRET\n",
            );
        }
    }
    let request = Request {
        path: path.to_owned(),
        query: pairs,
    };
    handler(&request)
}

fn write_response(stream: &mut TcpStream, response: &Response) -> io::Result<()> {
    let reason = match response.status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        505 => "HTTP Version Not Supported",
        _ => "Error",
    };
    let mut out = format!(
        "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\nConnection: close\r\n",
        response.status,
        response.content_type,
        response.body.len()
    );
    if response.status == 401 {
        out.push_str("WWW-Authenticate: Bearer\r\n");
    }
    out.push_str("\r\n");
    stream.write_all(out.as_bytes())?;
    stream.write_all(&response.body)?;
    stream.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(addr: SocketAddr, raw: &str) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(raw.as_bytes()).unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    fn server(secret: Option<Secret>, limits: HttpLimits) -> HttpServer {
        let handler: Handler =
            Arc::new(|r: &Request| Response::text(200, format!("path {}", r.path)));
        HttpServer::start(
            "127.0.0.1:0".parse().unwrap(),
            secret,
            false,
            limits,
            handler,
        )
        .unwrap()
    }

    #[test]
    fn token_is_required_when_a_secret_is_set() {
        let s = server(
            Some(Secret::new(b"s3cret".to_vec()).unwrap()),
            HttpLimits::default(),
        );
        let a = s.local_addr();
        let none = get(a, "GET /x HTTP/1.1\r\n\r\n");
        assert!(none.starts_with("HTTP/1.1 401"), "{none}");
        assert!(!none.contains("s3cret"));
        let wrong = get(a, "GET /x?token=s3creT HTTP/1.1\r\n\r\n");
        assert!(wrong.starts_with("HTTP/1.1 401"));
        let query = get(a, "GET /x?token=s3cret HTTP/1.1\r\n\r\n");
        assert!(
            query.starts_with("HTTP/1.1 200") && query.ends_with("path /x"),
            "{query}"
        );
        let header = get(a, "GET /y HTTP/1.1\r\nAuthorization: Bearer s3cret\r\n\r\n");
        assert!(header.starts_with("HTTP/1.1 200") && header.ends_with("path /y"));
    }

    #[test]
    fn requests_are_bounded() {
        let limits = HttpLimits {
            request_bytes_max: 256,
            timeout: Duration::from_millis(300),
            ..HttpLimits::default()
        };
        let s = server(None, limits);
        let a = s.local_addr();
        let big = format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(4096));
        assert!(get(a, &big).starts_with("HTTP/1.1 431"));
        assert!(get(a, "POST / HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
        // A silent client is dropped at the deadline, and others are still served.
        let started = Instant::now();
        let mut silent = TcpStream::connect(a).unwrap();
        let mut buf = String::new();
        let _ = silent.read_to_string(&mut buf);
        assert!(started.elapsed() < Duration::from_secs(3));
        assert!(get(a, "GET /ok HTTP/1.1\r\n\r\n").ends_with("path /ok"));
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("a%2Bb+c%zz%4"), b"a+b c%zz%4".to_vec());
    }
}
