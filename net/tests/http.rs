//! The observe HTTP server against hostile clients, over raw sockets from other loopback
//! addresses (`observe::http::flood`): the token only as a bearer credential or the login
//! cookie (never in a URL), a slow head cut at its deadline, held connections that cannot keep
//! a client out, refusals at a pace. Each test starts its own server in-process.

mod common;

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flint_net::observe::http::flood::{self, connect_from, get, request};
use flint_net::observe::http::{Access, HttpHandler, HttpLimits, HttpServer, Response, Site};
use flint_net::observe::token::ObserveToken;

const TOKEN: &str = "test-observe-token-0123456789";
const WAIT: Duration = Duration::from_secs(10);

fn ip(last: u8) -> IpAddr {
    IpAddr::from([127, 0, 0, last])
}

fn server(limits: HttpLimits) -> HttpServer {
    let handler: HttpHandler = Arc::new(|r| Response::text(200, format!("path {}", r.path)));
    let mut login = Response::ok("text/html", "<form id=\"login\"></form>");
    login.status = 401;
    let site = Site {
        handler,
        public: vec![("/public.js", Response::ok("text/javascript", "1"))],
        login: Some(login),
    };
    let token = ObserveToken::new(TOKEN.as_bytes()).expect("token");
    HttpServer::start(
        "127.0.0.1:0".parse().expect("addr"),
        Access::Token(token),
        limits,
        site,
    )
    .expect("server")
}

fn post_login(to: SocketAddr, body: &str) -> flood::Answer {
    let raw = format!(
        "POST /login HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    request(ip(1), to, raw.as_bytes(), WAIT).expect("login answer")
}

#[test]
fn the_token_is_a_bearer_or_a_login_cookie_never_in_a_url() {
    let s = server(HttpLimits::default());
    let to = s.local_addr();
    let html = request(
        ip(1),
        to,
        b"GET / HTTP/1.1\r\nAccept: text/html\r\n\r\n",
        WAIT,
    )
    .unwrap();
    assert_eq!(html.status, 401);
    assert!(
        html.text().contains("id=\"login\""),
        "a browser gets the login"
    );
    let plain = get(ip(1), to, "/metrics", None, WAIT).unwrap();
    assert_eq!(
        (plain.status, plain.header("WWW-Authenticate")),
        (401, Some("Bearer"))
    );
    let in_url = get(ip(1), to, &format!("/x?token={TOKEN}"), None, WAIT).unwrap();
    assert_eq!(in_url.status, 401, "a token in the URL is not accepted");
    let bearer = get(ip(1), to, "/x", Some(TOKEN), WAIT).unwrap();
    assert_eq!((bearer.status, bearer.text().as_str()), (200, "path /x"));
    assert_eq!(bearer.header("Referrer-Policy"), Some("no-referrer"));

    assert_eq!(post_login(to, "token=wrong-token-0123456789").status, 401);
    let logged = post_login(to, &format!("token={TOKEN}&next=/jobs%3Fid%3D3"));
    assert_eq!(logged.status, 303);
    assert_eq!(logged.header("Location"), Some("/jobs?id=3"));
    let cookie = logged.header("Set-Cookie").expect("a cookie").to_owned();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    assert!(!cookie.contains(TOKEN), "the cookie is not the token");
    let pair = cookie.split(';').next().unwrap();
    let raw = format!("GET /y HTTP/1.1\r\nCookie: other=1; {pair}\r\n\r\n");
    let with_cookie = request(ip(1), to, raw.as_bytes(), WAIT).unwrap();
    assert_eq!(
        (with_cookie.status, with_cookie.text().as_str()),
        (200, "path /y")
    );
    let elsewhere = post_login(to, &format!("token={TOKEN}&next=//elsewhere.example/"));
    assert_eq!(
        elsewhere.header("Location"),
        Some("/"),
        "no redirect off this server"
    );
    let public = get(ip(1), to, "/public.js", None, WAIT).unwrap();
    assert_eq!((public.status, public.text().as_str()), (200, "1"));
}

#[test]
fn a_slow_head_is_cut_at_its_deadline_while_others_are_served() {
    let s = server(HttpLimits::default());
    let to = s.local_addr();
    let started = Instant::now();
    let mut slow = connect_from(ip(3), to, WAIT).unwrap();
    slow.write_all(b"GET / HTTP/1.1\r\nX-Slow: ").unwrap();
    let mut good = 0;
    let cut = loop {
        assert!(started.elapsed() < WAIT, "the slow head was never cut");
        if slow.write_all(b"a").is_err() {
            break started.elapsed();
        }
        let mut byte = [0u8; 1];
        slow.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        if matches!(slow.read(&mut byte), Ok(0)) {
            break started.elapsed();
        }
        if good < 5 {
            assert_eq!(
                get(ip(2), to, "/ok", Some(TOKEN), WAIT).unwrap().status,
                200
            );
            good += 1;
        }
    };
    assert!(cut >= Duration::from_millis(1400), "cut early: {cut:?}");
    assert_eq!(good, 5);
}

#[test]
fn held_connections_cannot_keep_a_client_out() {
    let limits = HttpLimits {
        per_address_max: 8,
        connections_max: 16,
        ..HttpLimits::default()
    };
    let s = server(limits);
    let to = s.local_addr();
    let held: Vec<_> = (0..40)
        .map(|i| connect_from(ip(3 + (i % 2) as u8), to, WAIT).unwrap())
        .collect();
    // From an address that holds its cap (once its oldest is 100 ms old: a newcomer evicts only
    // connections that old, so a client reconnecting in a loop churns through cheap refusals),
    // and from a fresh one: both answered.
    std::thread::sleep(Duration::from_millis(150));
    assert_eq!(get(ip(3), to, "/a", Some(TOKEN), WAIT).unwrap().status, 200);
    assert_eq!(get(ip(5), to, "/b", Some(TOKEN), WAIT).unwrap().status, 200);
    // The server kept at most its cap of them: the rest were closed, not left waiting.
    common::wait_until("the evicted connections closed", || {
        let open = held
            .iter()
            .filter(|c| {
                c.set_nonblocking(true).unwrap();
                let mut byte = [0u8; 1];
                matches!(c.peek(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
            })
            .count();
        open <= 16
    });
}

#[test]
fn refusals_are_paced_per_address() {
    let s = server(HttpLimits::default());
    let to = s.local_addr();
    let attack = flood::unauthenticated(ip(6), to, 16);
    let started = Instant::now();
    std::thread::sleep(Duration::from_millis(300));
    // Others are not held up: a good client, and another address without the token.
    assert_eq!(get(ip(2), to, "/g", Some(TOKEN), WAIT).unwrap().status, 200);
    assert_eq!(get(ip(7), to, "/g", None, WAIT).unwrap().status, 401);
    std::thread::sleep(Duration::from_millis(1700));
    let stats = attack.stop();
    let seconds = started.elapsed().as_secs_f64();
    // 10 at once, then 5 a second (plus the answers in flight when it stopped).
    let bound = 10.0 + 5.0 * seconds + 16.0;
    assert!(
        (stats.answers as f64) <= bound,
        "{} refusals answered in {seconds:.1} s (at most {bound:.0})",
        stats.answers
    );
    assert!(stats.answers >= 10, "{stats:?}");
}
