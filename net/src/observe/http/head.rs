//! A request head parsed (by `httparse`, the parser under hyper) into what the server uses,
//! and an answer encoded with the headers every answer carries.
//!
//! Refused shapes: anything but HTTP/1.x, a target that is not a path (`http://...`, `*`),
//! `Transfer-Encoding` (no chunked bodies), two different `Content-Length`s, a body over
//! [`BODY_BYTES_MAX`], more than [`HEADERS_MAX`] headers.

use super::{Request, Response};

/// Headers a request may have.
pub const HEADERS_MAX: usize = 32;
/// Bytes a request body may have (only `POST /login` has one).
pub const BODY_BYTES_MAX: usize = 1024;

/// A request's method, as far as the server cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// `GET`.
    Get,
    /// `HEAD`: a `GET` whose answer has no body.
    Head,
    /// `POST` (the login form).
    Post,
    /// Anything else.
    Other,
}

/// A parsed head.
#[derive(Debug)]
pub struct Head {
    /// Its method.
    pub method: Method,
    /// Its path and query.
    pub request: Request,
    /// The bearer credential, if any.
    pub bearer: Option<Vec<u8>>,
    /// The login cookie's value, if any.
    pub cookie: Option<Vec<u8>>,
    /// Whether the client takes HTML (a browser).
    pub wants_html: bool,
    /// Bytes of the head.
    pub head_len: usize,
    /// Bytes of the body that follows.
    pub body_len: usize,
}

/// What the bytes so far make.
#[derive(Debug)]
pub enum Parsed {
    /// Not a whole head yet.
    Partial,
    /// A whole head.
    Complete(Head),
    /// Refused with this status and text.
    Bad(u16, &'static str),
}

/// Parses the head at the start of `buf`, which may hold at most `head_max` bytes of it;
/// `cookie` names the login cookie.
pub fn parse(buf: &[u8], head_max: usize, cookie: &str) -> Parsed {
    let mut headers = [httparse::EMPTY_HEADER; HEADERS_MAX];
    let mut req = httparse::Request::new(&mut headers);
    let head_len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) if n <= head_max => n,
        Ok(httparse::Status::Complete(_)) => return Parsed::Bad(431, "request head too large\n"),
        Ok(httparse::Status::Partial) if buf.len() >= head_max => {
            return Parsed::Bad(431, "request head too large\n")
        }
        Ok(httparse::Status::Partial) => return Parsed::Partial,
        Err(httparse::Error::TooManyHeaders) => return Parsed::Bad(431, "too many headers\n"),
        Err(_) => return Parsed::Bad(400, "bad request\n"),
    };
    let method = match req.method.unwrap_or("") {
        "GET" => Method::Get,
        "HEAD" => Method::Head,
        "POST" => Method::Post,
        _ => Method::Other,
    };
    let target = req.path.unwrap_or("");
    if !target.starts_with('/') {
        return Parsed::Bad(400, "the target must be a path\n");
    }
    let mut head = Head {
        method,
        request: request(target),
        bearer: None,
        cookie: None,
        wants_html: false,
        head_len,
        body_len: 0,
    };
    match headers_into(req.headers, &mut head, cookie) {
        Ok(()) => Parsed::Complete(head),
        Err((status, text)) => Parsed::Bad(status, text),
    }
}

/// The path and query of a target (values left encoded).
fn request(target: &str) -> Request {
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let query = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (k.to_owned(), v.to_owned())
        })
        .collect();
    Request {
        path: path.to_owned(),
        query,
        accept: None,
    }
}

/// The headers the server reads.
fn headers_into(
    headers: &[httparse::Header<'_>],
    head: &mut Head,
    cookie_name: &str,
) -> Result<(), (u16, &'static str)> {
    let mut length: Option<usize> = None;
    for header in headers {
        let name = header.name;
        let value = header.value;
        if name.eq_ignore_ascii_case("authorization") && head.bearer.is_none() {
            head.bearer = bearer(value).map(<[u8]>::to_vec);
        } else if name.eq_ignore_ascii_case("cookie") && head.cookie.is_none() {
            head.cookie = cookie(value, cookie_name).map(<[u8]>::to_vec);
        } else if name.eq_ignore_ascii_case("accept") {
            let accept = String::from_utf8_lossy(value).into_owned();
            head.wants_html = accept.contains("text/html");
            head.request.accept = Some(accept);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            return Err((400, "no Transfer-Encoding: send Content-Length\n"));
        } else if name.eq_ignore_ascii_case("content-length") {
            let n = std::str::from_utf8(value)
                .ok()
                .and_then(|v| v.trim().parse::<usize>().ok())
                .ok_or((400, "bad Content-Length\n"))?;
            if length.is_some_and(|l| l != n) {
                return Err((400, "two Content-Lengths\n"));
            }
            length = Some(n);
        }
    }
    head.body_len = length.unwrap_or(0);
    if head.body_len > BODY_BYTES_MAX {
        return Err((413, "request body too large\n"));
    }
    Ok(())
}

fn bearer(value: &[u8]) -> Option<&[u8]> {
    let value = value.trim_ascii();
    let (scheme, rest) = value.split_at(value.iter().position(|&b| b == b' ')?);
    scheme
        .eq_ignore_ascii_case(b"bearer")
        .then(|| rest.trim_ascii())
}

fn cookie<'a>(value: &'a [u8], name: &str) -> Option<&'a [u8]> {
    value.split(|&b| b == b';').find_map(|pair| {
        let pair = pair.trim_ascii();
        let rest = pair.strip_prefix(name.as_bytes())?;
        rest.strip_prefix(b"=")
    })
}

/// The value of `key` in a form body (`application/x-www-form-urlencoded`), decoded.
pub fn form_value(body: &[u8], key: &str) -> Option<Vec<u8>> {
    body.split(|&b| b == b'&').find_map(|pair| {
        let rest = pair.strip_prefix(key.as_bytes())?.strip_prefix(b"=")?;
        Some(percent_decode(rest))
    })
}

/// Decodes `%XX` and `+`.
fn percent_decode(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes.get(i + 1..i + 3).and_then(|h| {
            let h = std::str::from_utf8(h).ok()?;
            u8::from_str_radix(h, 16).ok()
        });
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
                continue;
            }
            (b'+', _) => out.push(b' '),
            (b, _) => out.push(b),
        }
        i += 1;
    }
    out
}

/// What every answer says besides its own headers: no caching, no sniffing, no referrer (so a
/// page's address never leaves with a link), no framing, scripts from this origin only.
const COMMON_HEADERS: &str = "Cache-Control: no-store\r\n\
    X-Content-Type-Options: nosniff\r\n\
    Referrer-Policy: no-referrer\r\n\
    X-Frame-Options: DENY\r\n\
    Content-Security-Policy: default-src 'none'; script-src 'self'; style-src 'unsafe-inline'; \
    img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; \
    base-uri 'none'\r\n\
    Connection: close\r\n";

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        303 => "See Other",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        406 => "Not Acceptable",
        413 => "Content Too Large",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Error",
    }
}

/// The answer's bytes (without the body for a `HEAD`).
pub fn encode(response: &Response, head_only: bool) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n{COMMON_HEADERS}",
        response.status,
        reason(response.status),
        response.content_type,
        response.body.len()
    );
    for (name, value) in &response.headers {
        out.push_str(name);
        out.push_str(": ");
        out.push_str(value);
        out.push_str("\r\n");
    }
    out.push_str("\r\n");
    let mut bytes = out.into_bytes();
    if !head_only {
        bytes.extend_from_slice(&response.body);
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn complete(raw: &str) -> Head {
        match parse(raw.as_bytes(), 8192, "flint_observe") {
            Parsed::Complete(head) => head,
            other => panic!("{raw:?}: {other:?}"),
        }
    }

    fn bad(raw: &str) -> u16 {
        match parse(raw.as_bytes(), 256, "flint_observe") {
            Parsed::Bad(status, _) => status,
            other => panic!("{raw:?}: {other:?}"),
        }
    }

    #[test]
    fn heads_give_what_the_server_reads() {
        let head = complete(
            "GET /api/v1/jobs?id=3&x HTTP/1.1\r\nAuthorization: Bearer  abc \r\n\
             Cookie: a=b; flint_observe=c00k1e\r\nAccept: text/html,*/*\r\n\r\n",
        );
        assert_eq!(head.method, Method::Get);
        assert_eq!(head.request.path, "/api/v1/jobs");
        assert_eq!(head.request.param("id"), Some("3"));
        assert_eq!(head.request.param("x"), Some(""));
        assert_eq!(head.bearer.as_deref(), Some(&b"abc"[..]));
        assert_eq!(head.cookie.as_deref(), Some(&b"c00k1e"[..]));
        assert!(head.wants_html);
        let post = complete("POST /login HTTP/1.0\r\nContent-Length: 12\r\n\r\ntoken=a%2Bb+");
        assert_eq!((post.method, post.body_len), (Method::Post, 12));
        assert!(matches!(
            parse(b"GET / HTTP/1.1\r\nHost: x\r\n", 8192, "c"),
            Parsed::Partial
        ));
    }

    #[test]
    fn hostile_shapes_are_refused() {
        assert_eq!(
            bad(&format!("GET / HTTP/1.1\r\nX: {}", "a".repeat(300))),
            431
        );
        assert_eq!(bad("GET http://x/ HTTP/1.1\r\n\r\n"), 400);
        assert_eq!(bad("GET / HTTP/2.0\r\n\r\n"), 400);
        assert_eq!(
            bad("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"),
            400
        );
        assert_eq!(
            bad("POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n"),
            400
        );
        assert_eq!(bad("POST / HTTP/1.1\r\nContent-Length: 5000\r\n\r\n"), 413);
        assert_eq!(bad("GET / HTTP/1.1\r\nBad Header\r\n\r\n"), 400);
        let many: String = (0..40).map(|i| format!("H{i}: v\r\n")).collect();
        assert_eq!(
            match parse(
                format!("GET / HTTP/1.1\r\n{many}\r\n").as_bytes(),
                8192,
                "c"
            ) {
                Parsed::Bad(status, _) => status,
                _ => 0,
            },
            431
        );
    }

    #[test]
    fn forms_decode() {
        assert_eq!(
            form_value(b"a=1&token=a%2Bb+c%zz%4", "token"),
            Some(b"a+b c%zz%4".to_vec())
        );
        assert_eq!(form_value(b"tokens=1", "token"), None);
    }

    #[test]
    fn answers_carry_the_common_headers() {
        let mut response = Response::text(401, "no");
        response.headers.push(("WWW-Authenticate", "Bearer".into()));
        let text = String::from_utf8(encode(&response, false)).unwrap();
        assert!(text.starts_with("HTTP/1.1 401 Unauthorized\r\n"));
        assert!(text.contains("\r\nReferrer-Policy: no-referrer\r\n"));
        assert!(text.contains("\r\nWWW-Authenticate: Bearer\r\n"));
        assert!(text.ends_with("\r\n\r\nno"));
        let head = String::from_utf8(encode(&response, true)).unwrap();
        assert!(head.ends_with("\r\n\r\n") && head.contains("Content-Length: 2\r\n"));
    }
}
