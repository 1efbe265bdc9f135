//! A test double of the Kubernetes API server: the parts of the core v1 pods and secrets API
//! Flint uses, over real HTTP/1.1 on 127.0.0.1, with a "kubelet" that runs each pod's
//! container command as a local process.
//!
//! What it implements, as the API conventions specify it:
//!
//! - pods: create (`POST`), get, delete (graceful: `deletionTimestamp` set, the process gets
//!   SIGTERM, SIGKILL after the grace period, the object goes when the process has exited;
//!   `gracePeriodSeconds` from the query or the `DeleteOptions` body), list and watch with
//!   `labelSelector` (`=`, `==`, `!=`, `in`, `notin`, exists, `!` not exists) and
//!   `fieldSelector` (`metadata.name`, `metadata.namespace`, `status.phase`,
//!   `spec.nodeName`, `spec.restartPolicy`; any other field is refused with 400 as the real
//!   server does);
//! - secrets: create, get, delete, list;
//! - `resourceVersion`: one counter for every change; lists carry the current one; a watch
//!   from `""`/`"0"` first sends the current objects as `ADDED`; a watch from a version older
//!   than the retained history (see [`ApiDouble::compact`]) gets a 200 with one `ERROR` event
//!   holding a 410 `Expired` status, as the real server answers; `timeoutSeconds` ends the
//!   stream normally; bookmarks are optional and never sent;
//! - watch streams are chunked JSON lines `{"type":..,"object":..}` (`ADDED`, `MODIFIED`,
//!   `DELETED`, `ERROR`);
//! - what the server refuses: names that are not DNS-1123 subdomains, invalid label keys or
//!   values, owner references without apiVersion, kind, name or uid or with two controllers, pods without containers or with a container lacking a name or an image, an env var
//!   with both `value` and `valueFrom`, an unknown `restartPolicy`, a namespace in the body
//!   differing from the path's (400), an existing name (409 `AlreadyExists`), a missing object
//!   (404), a bad selector (400), secret data that is not base64 (400).
//!
//! The kubelet: a pending pod whose secrets exist gets its container started (command and
//! args, a clean environment with the pod's env, `secretKeyRef` values read from the Secret; a
//! missing Secret leaves it pending with `CreateContainerConfigError`) and goes `Running`; the
//! process's exit makes it `Succeeded` (code 0) or `Failed` with the container's exit code
//! (128 + the signal for a signal) and reason `Error`. `restartPolicy` is treated as `Never`.
//!
//! Fault injection, for tests: [`ApiDouble::fail_for`] (every API request answers a status,
//! e.g. 500, for a while), [`ApiDouble::slow_for`], [`ApiDouble::cut_watches`] (open watch
//! streams are cut without their terminating chunk), [`ApiDouble::compact`] (history dropped:
//! resuming a watch gets 410), [`ApiDouble::stuck_pending`] (the next pods are never
//! scheduled).

use std::collections::{BTreeMap, VecDeque};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use base64::Engine;
use serde_json::{json, Value};

/// How many changes the double keeps for watches to resume from.
const HISTORY: usize = 10_000;

/// Counters of what the double served.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    /// API requests answered.
    pub requests: u64,
    /// Requests answered with an injected error.
    pub injected: u64,
    /// Pod lists answered (not watches).
    pub pod_lists: u64,
    /// Pod watches opened.
    pub watches: u64,
    /// Watches answered with 410 Gone.
    pub gone: u64,
    /// Watch streams cut.
    pub cut: u64,
    /// Pods created.
    pub pods_created: u64,
    /// Pods removed (the object gone).
    pub pods_removed: u64,
}

/// A pod as the double holds it, for tests.
#[derive(Debug, Clone)]
pub struct PodView {
    /// Its name.
    pub name: String,
    /// Its phase.
    pub phase: String,
    /// Whether it is being deleted.
    pub deleting: bool,
    /// Its container's process, while it runs.
    pub pid: Option<u32>,
    /// The whole object.
    pub object: Value,
}

struct Proc {
    child: Child,
    kill_at: Option<Instant>,
}

#[derive(Default)]
struct Inner {
    /// The version `/version` answers (see [`ApiDouble::answer_as`]).
    version: Option<(String, String)>,
    /// A field lists leave out (see [`ApiDouble::answer_as`]).
    omitted: Option<String>,
    rv: u64,
    uid: u64,
    /// (kind, namespace, name) -> object.
    objects: BTreeMap<(String, String, String), Value>,
    /// Pod changes: (resourceVersion, namespace, event type, object).
    history: VecDeque<(u64, String, &'static str, Value)>,
    /// Watches may resume from versions at or after this one.
    oldest_rv: u64,
    fail: Option<(Instant, u16)>,
    slow: Option<(Instant, Duration)>,
    cut_epoch: u64,
    stuck: u32,
    /// Pods the kubelet will never start.
    unschedulable: std::collections::BTreeSet<(String, String)>,
    procs: BTreeMap<(String, String), Proc>,
    counters: Counters,
}

struct State {
    inner: Mutex<Inner>,
    changed: Condvar,
    stop: AtomicBool,
    log_dir: PathBuf,
}

impl State {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The running double (see the module docs); dropping it kills its processes.
pub struct ApiDouble {
    addr: SocketAddr,
    state: Arc<State>,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for ApiDouble {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiDouble")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl ApiDouble {
    /// Starts the server on a free port of 127.0.0.1 and the kubelet; container stderr goes to
    /// `log_dir/POD.log`.
    pub fn start(log_dir: PathBuf) -> std::io::Result<ApiDouble> {
        std::fs::create_dir_all(&log_dir)?;
        let listener = TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let state = Arc::new(State {
            inner: Mutex::new(Inner::default()),
            changed: Condvar::new(),
            stop: AtomicBool::new(false),
            log_dir,
        });
        let accept_state = state.clone();
        let accept = std::thread::Builder::new()
            .name("k8s-double-accept".into())
            .spawn(move || {
                while !accept_state.stop.load(Ordering::SeqCst) {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            let state = accept_state.clone();
                            let _ = std::thread::Builder::new()
                                .name("k8s-double-conn".into())
                                .spawn(move || serve(state, stream));
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            })?;
        let kubelet_state = state.clone();
        let kubelet = std::thread::Builder::new()
            .name("k8s-double-kubelet".into())
            .spawn(move || kubelet(kubelet_state))?;
        Ok(ApiDouble {
            addr,
            state,
            threads: vec![accept, kubelet],
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its URL, `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every API request answers `code` (e.g. 500, 503, 429) for `duration`.
    pub fn fail_for(&self, code: u16, duration: Duration) {
        self.state.lock().fail = Some((Instant::now() + duration, code));
    }

    /// Every API request waits `delay` before it is answered, for `duration`.
    pub fn slow_for(&self, delay: Duration, duration: Duration) {
        self.state.lock().slow = Some((Instant::now() + duration, delay));
    }

    /// Cuts every open watch stream (the connection closes without the terminating chunk).
    pub fn cut_watches(&self) {
        self.state.lock().cut_epoch += 1;
        self.state.changed.notify_all();
    }

    /// Compacts the history (as etcd does): versions up to now are forgotten, so an open
    /// watch gets a 410 `ERROR` event at its next change, and a watch resuming from any version
    /// before now gets 410 Gone; a new list gives a version watches can start from.
    pub fn compact(&self) {
        let mut inner = self.state.lock();
        inner.history.clear();
        inner.rv += 1;
        inner.oldest_rv = inner.rv;
    }

    /// The next `count` pods created are never scheduled (they stay pending).
    pub fn stuck_pending(&self, count: u32) {
        self.state.lock().stuck += count;
    }

    /// Answers as another version of the API server would: `/version` says `major.minor`,
    /// and lists leave out their field `omit` (e.g. `items`), the shape of a server that
    /// does not have it.
    pub fn answer_as(&self, major: &str, minor: &str, omit: Option<&str>) {
        let mut inner = self.state.lock();
        inner.version = Some((major.to_owned(), minor.to_owned()));
        inner.omitted = omit.map(str::to_owned);
    }

    /// What was served so far.
    pub fn counters(&self) -> Counters {
        self.state.lock().counters.clone()
    }

    /// The pods in `namespace`.
    pub fn pods(&self, namespace: &str) -> Vec<PodView> {
        let inner = self.state.lock();
        inner
            .objects
            .iter()
            .filter(|((kind, ns, _), _)| kind == "pods" && ns == namespace)
            .map(|((_, ns, name), pod)| PodView {
                name: name.clone(),
                phase: pod["status"]["phase"].as_str().unwrap_or("").to_string(),
                deleting: !pod["metadata"]["deletionTimestamp"].is_null(),
                pid: inner
                    .procs
                    .get(&(ns.clone(), name.clone()))
                    .map(|p| p.child.id()),
                object: pod.clone(),
            })
            .collect()
    }

    /// The names of the secrets in `namespace`.
    pub fn secrets(&self, namespace: &str) -> Vec<String> {
        self.state
            .lock()
            .objects
            .keys()
            .filter(|(kind, ns, _)| kind == "secrets" && ns == namespace)
            .map(|(_, _, name)| name.clone())
            .collect()
    }

    /// Creates an object directly (as another client would), e.g. a leftover pod.
    pub fn insert(&self, kind: &str, namespace: &str, object: Value) -> Result<Value, String> {
        let mut inner = self.state.lock();
        let result = create(&mut inner, kind, namespace, object);
        self.state.changed.notify_all();
        result.map_err(|(code, message)| format!("{code}: {message}"))
    }
}

impl Drop for ApiDouble {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::SeqCst);
        self.state.changed.notify_all();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
        let mut inner = self.state.lock();
        for proc in inner.procs.values_mut() {
            let _ = proc.child.kill();
            let _ = proc.child.wait();
        }
    }
}

// ---- time, names, selectors --------------------------------------------------------------

fn now_rfc3339() -> String {
    let secs = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(dns_label)
}

fn label_value(s: &str) -> bool {
    s.len() <= 63
        && (s.is_empty()
            || (s
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
                && s.as_bytes()[0].is_ascii_alphanumeric()
                && s.as_bytes()[s.len() - 1].is_ascii_alphanumeric()))
}

fn label_key(s: &str) -> bool {
    let (prefix, name) = match s.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    prefix.is_none_or(dns_subdomain) && !name.is_empty() && label_value(name)
}

#[derive(Debug)]
enum Requirement {
    Eq(String, String),
    Ne(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// Splits on commas outside parentheses.
fn split_top(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

fn parse_labels(selector: &str) -> Result<Vec<Requirement>, String> {
    let mut out = Vec::new();
    if selector.trim().is_empty() {
        return Ok(out);
    }
    for part in split_top(selector) {
        let part = part.trim();
        let bad = || format!("unable to parse requirement: {part:?}");
        let key_ok = |k: &str| {
            if label_key(k) {
                Ok(k.to_string())
            } else {
                Err(format!("invalid label key {k:?}"))
            }
        };
        let set = |rest: &str| -> Result<Vec<String>, String> {
            let rest = rest.trim();
            let inner = rest
                .strip_prefix('(')
                .and_then(|r| r.strip_suffix(')'))
                .ok_or_else(bad)?;
            inner
                .split(',')
                .map(|v| {
                    let v = v.trim();
                    if label_value(v) {
                        Ok(v.to_string())
                    } else {
                        Err(bad())
                    }
                })
                .collect()
        };
        if let Some((k, v)) = part.split_once("!=") {
            out.push(Requirement::Ne(key_ok(k.trim())?, v.trim().to_string()));
        } else if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
            let v = v.trim();
            if !label_value(v) {
                return Err(bad());
            }
            out.push(Requirement::Eq(key_ok(k.trim())?, v.to_string()));
        } else if let Some((k, rest)) = part.split_once(" notin ") {
            out.push(Requirement::NotIn(key_ok(k.trim())?, set(rest)?));
        } else if let Some((k, rest)) = part.split_once(" in ") {
            out.push(Requirement::In(key_ok(k.trim())?, set(rest)?));
        } else if let Some(k) = part.strip_prefix('!') {
            out.push(Requirement::NotExists(key_ok(k.trim())?));
        } else if !part.contains(' ') && !part.contains('(') {
            out.push(Requirement::Exists(key_ok(part)?));
        } else {
            return Err(bad());
        }
    }
    Ok(out)
}

fn labels_match(reqs: &[Requirement], object: &Value) -> bool {
    let labels = &object["metadata"]["labels"];
    let get = |k: &str| labels.get(k).and_then(Value::as_str);
    reqs.iter().all(|r| match r {
        Requirement::Eq(k, v) => get(k) == Some(v.as_str()),
        Requirement::Ne(k, v) => get(k) != Some(v.as_str()),
        Requirement::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
        Requirement::NotIn(k, vs) => get(k).is_none_or(|x| !vs.iter().any(|v| v == x)),
        Requirement::Exists(k) => get(k).is_some(),
        Requirement::NotExists(k) => get(k).is_none(),
    })
}

/// Pod fields the real server can select on (of those, the ones the double knows).
fn field_path(field: &str) -> Option<&'static [&'static str]> {
    Some(match field {
        "metadata.name" => &["metadata", "name"],
        "metadata.namespace" => &["metadata", "namespace"],
        "status.phase" => &["status", "phase"],
        "spec.nodeName" => &["spec", "nodeName"],
        "spec.restartPolicy" => &["spec", "restartPolicy"],
        _ => return None,
    })
}

type FieldReq = (&'static [&'static str], bool, String);

fn parse_fields(kind: &str, selector: &str) -> Result<Vec<FieldReq>, String> {
    let mut out = Vec::new();
    if selector.trim().is_empty() {
        return Ok(out);
    }
    for part in selector.split(',') {
        let (field, negate, value) = if let Some((f, v)) = part.split_once("!=") {
            (f, true, v)
        } else if let Some((f, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
            (f, false, v)
        } else {
            return Err(format!(
                "invalid selector: '{part}'; can't understand '{part}'"
            ));
        };
        let path = match (kind, field.trim()) {
            ("pods", f) => field_path(f),
            (_, "metadata.name") => Some(&["metadata", "name"][..]),
            (_, "metadata.namespace") => Some(&["metadata", "namespace"][..]),
            _ => None,
        }
        .ok_or_else(|| format!("field label not supported: {}", field.trim()))?;
        out.push((path, negate, value.trim().to_string()));
    }
    Ok(out)
}

fn fields_match(reqs: &[FieldReq], object: &Value) -> bool {
    reqs.iter().all(|(path, negate, value)| {
        let mut v = object;
        for p in path.iter() {
            v = &v[*p];
        }
        (v.as_str().unwrap_or("") == value) != *negate
    })
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                match u8::from_str_radix(s.get(i + 1..i + 3).unwrap_or(""), 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

// ---- objects --------------------------------------------------------------------------------

type ApiError = (u16, String);

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code,
    })
}

fn reason_of(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        409 => "AlreadyExists",
        410 => "Expired",
        411 => "LengthRequired",
        422 => "Invalid",
        429 => "TooManyRequests",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "InternalError",
    }
}

fn invalid(kind: &str, name: &str, what: String) -> ApiError {
    (422, format!("{kind} \"{name}\" is invalid: {what}"))
}

fn validate_metadata(kind: &str, namespace: &str, object: &mut Value) -> Result<String, ApiError> {
    let meta = object
        .get_mut("metadata")
        .filter(|m| m.is_object())
        .ok_or((400, "metadata is required".to_string()))?;
    match meta.get("namespace").and_then(Value::as_str) {
        Some(ns) if ns != namespace => return Err((
            400,
            "the namespace of the provided object does not match the namespace sent on the request"
                .into(),
        )),
        _ => {}
    }
    let name = object_name(kind, meta)?;
    check_labels(kind, &name, meta)?;
    check_owners(kind, &name, meta)?;
    if meta.get("resourceVersion").is_some_and(|v| !v.is_null()) {
        return Err((
            500,
            "resourceVersion should not be set on objects to be created".into(),
        ));
    }
    meta["name"] = json!(name);
    meta["namespace"] = json!(namespace);
    Ok(name)
}

/// The new object's name: `metadata.name`, else `generateName` with a random suffix; a DNS
/// subdomain.
fn object_name(kind: &str, meta: &Value) -> Result<String, ApiError> {
    let name = match (
        meta.get("name").and_then(Value::as_str),
        meta.get("generateName").and_then(Value::as_str),
    ) {
        (Some(name), _) if !name.is_empty() => name.to_string(),
        (_, Some(prefix)) => format!("{prefix}{:05x}", rand_suffix()),
        _ => {
            return Err(invalid(
                kind,
                "",
                "metadata.name: Required value: name or generateName is required".into(),
            ))
        }
    };
    if !dns_subdomain(&name) {
        return Err(invalid(kind, &name, format!("metadata.name: Invalid value: {name:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.'")));
    }
    Ok(name)
}

/// `metadata.labels`, if given: a map of valid label keys to valid string values.
fn check_labels(kind: &str, name: &str, meta: &Value) -> Result<(), ApiError> {
    let Some(labels) = meta.get("labels") else {
        return Ok(());
    };
    let labels = labels
        .as_object()
        .ok_or_else(|| (400, "metadata.labels must be a map".to_string()))?;
    for (k, v) in labels {
        let v = v
            .as_str()
            .ok_or_else(|| (400, format!("label {k} must be a string")))?;
        if !label_key(k) || !label_value(v) {
            return Err(invalid(
                kind,
                name,
                format!("metadata.labels: Invalid value: {k:?}={v:?}"),
            ));
        }
    }
    Ok(())
}

/// `metadata.ownerReferences`, if given: each names its owner in full, at most one controls.
fn check_owners(kind: &str, name: &str, meta: &Value) -> Result<(), ApiError> {
    let Some(owners) = meta.get("ownerReferences").and_then(Value::as_array) else {
        return Ok(());
    };
    for (i, owner) in owners.iter().enumerate() {
        for field in ["apiVersion", "kind", "name", "uid"] {
            if owner[field].as_str().is_none_or(str::is_empty) {
                return Err(invalid(
                    kind,
                    name,
                    format!("metadata.ownerReferences[{i}].{field}: Invalid value: \"\": {field} must not be empty"),
                ));
            }
        }
    }
    if owners.iter().filter(|o| o["controller"] == true).count() > 1 {
        return Err(invalid(
            kind,
            name,
            "metadata.ownerReferences: Invalid value: Only one reference can have Controller set to true".into(),
        ));
    }
    Ok(())
}

fn rand_suffix() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() as u64)
        & 0xfffff
}

fn validate_pod(name: &str, pod: &Value) -> Result<(), ApiError> {
    let spec = &pod["spec"];
    let containers = spec["containers"]
        .as_array()
        .filter(|c| !c.is_empty())
        .ok_or_else(|| invalid("Pod", name, "spec.containers: Required value".into()))?;
    for (i, c) in containers.iter().enumerate() {
        let cname = c["name"].as_str().unwrap_or("");
        if !dns_label(cname) {
            return Err(invalid(
                "Pod",
                name,
                format!("spec.containers[{i}].name: Invalid value: {cname:?}"),
            ));
        }
        if c["image"].as_str().is_none_or(str::is_empty) {
            return Err(invalid(
                "Pod",
                name,
                format!("spec.containers[{i}].image: Required value"),
            ));
        }
        for (j, e) in c["env"].as_array().into_iter().flatten().enumerate() {
            if e["name"].as_str().is_none_or(str::is_empty) {
                return Err(invalid(
                    "Pod",
                    name,
                    format!("spec.containers[{i}].env[{j}].name: Required value"),
                ));
            }
            if !e["value"].is_null() && !e["valueFrom"].is_null() {
                return Err(invalid("Pod", name, format!("spec.containers[{i}].env[{j}].valueFrom: Invalid value: \"\": may not be specified when `value` is not empty")));
            }
        }
    }
    match spec["restartPolicy"].as_str() {
        None | Some("Always" | "OnFailure" | "Never") => Ok(()),
        Some(other) => Err(invalid(
            "Pod",
            name,
            format!("spec.restartPolicy: Unsupported value: {other:?}"),
        )),
    }
}

fn record(inner: &mut Inner, namespace: &str, kind: &str, event: &'static str, object: &Value) {
    if kind != "pods" {
        return;
    }
    inner
        .history
        .push_back((inner.rv, namespace.to_string(), event, object.clone()));
    if inner.history.len() > HISTORY {
        if let Some((rv, ..)) = inner.history.pop_front() {
            inner.oldest_rv = rv;
        }
    }
}

fn bump(inner: &mut Inner, object: &mut Value) {
    inner.rv += 1;
    object["metadata"]["resourceVersion"] = json!(inner.rv.to_string());
}

fn create(
    inner: &mut Inner,
    kind: &str,
    namespace: &str,
    mut object: Value,
) -> Result<Value, ApiError> {
    let (want_kind, label) = match kind {
        "pods" => ("Pod", "pods"),
        "secrets" => ("Secret", "secrets"),
        _ => {
            return Err((
                404,
                "the server could not find the requested resource".into(),
            ))
        }
    };
    if !object.is_object() {
        return Err((400, "the body is not a JSON object".into()));
    }
    match object.get("kind").and_then(Value::as_str) {
        None | Some("") => object["kind"] = json!(want_kind),
        Some(k) if k == want_kind => {}
        Some(k) => return Err((400, format!("the kind {k} does not match {want_kind}"))),
    }
    object["apiVersion"] = json!("v1");
    let name = validate_metadata(want_kind, namespace, &mut object)?;
    let key = (label.to_string(), namespace.to_string(), name.clone());
    if inner.objects.contains_key(&key) {
        return Err((409, format!("{label} \"{name}\" already exists")));
    }
    match kind {
        "pods" => {
            validate_pod(&name, &object)?;
            object["status"] = json!({"phase": "Pending", "qosClass": "Burstable"});
            inner.counters.pods_created += 1;
            if inner.stuck > 0 {
                inner.stuck -= 1;
                inner
                    .unschedulable
                    .insert((namespace.to_string(), name.clone()));
                object["status"]["conditions"] = json!([{
                    "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                    "message": "0/1 nodes are available (test double: stuck on purpose)",
                }]);
            }
        }
        _ => {
            if let Some(data) = object.get("data").and_then(Value::as_object) {
                for (k, v) in data {
                    let ok = v.as_str().is_some_and(|s| {
                        base64::engine::general_purpose::STANDARD.decode(s).is_ok()
                    });
                    if !ok {
                        return Err((400, format!("illegal base64 data in secret key {k}")));
                    }
                }
            }
        }
    }
    inner.uid += 1;
    object["metadata"]["uid"] = json!(format!("00000000-0000-4000-8000-{:012x}", inner.uid));
    object["metadata"]["creationTimestamp"] = json!(now_rfc3339());
    bump(inner, &mut object);
    record(inner, namespace, kind, "ADDED", &object);
    inner.objects.insert(key, object.clone());
    Ok(object)
}

fn remove_pod(inner: &mut Inner, namespace: &str, name: &str) {
    let key = ("pods".to_string(), namespace.to_string(), name.to_string());
    if let Some(mut pod) = inner.objects.remove(&key) {
        bump(inner, &mut pod);
        record(inner, namespace, "pods", "DELETED", &pod);
        inner.counters.pods_removed += 1;
        inner
            .unschedulable
            .remove(&(namespace.to_string(), name.to_string()));
    }
}

fn delete(
    inner: &mut Inner,
    kind: &str,
    namespace: &str,
    name: &str,
    grace: Option<u64>,
) -> Result<Value, ApiError> {
    let key = (kind.to_string(), namespace.to_string(), name.to_string());
    let Some(object) = inner.objects.get(&key).cloned() else {
        return Err((404, format!("{kind} \"{name}\" not found")));
    };
    if kind != "pods" {
        inner.objects.remove(&key);
        inner.rv += 1;
        return Ok(status_success(kind, name));
    }
    let pkey = (namespace.to_string(), name.to_string());
    let grace = grace.unwrap_or(30);
    match inner.procs.get_mut(&pkey) {
        Some(proc) if grace > 0 => {
            if !object["metadata"]["deletionTimestamp"].is_null() {
                return Ok(object);
            }
            // SIGTERM now, SIGKILL after the grace period; the kubelet removes it on exit.
            let _ = Command::new("kill")
                .args(["-TERM", &proc.child.id().to_string()])
                .status();
            proc.kill_at = Some(Instant::now() + Duration::from_secs(grace));
            let mut pod = object;
            pod["metadata"]["deletionTimestamp"] = json!(now_rfc3339());
            pod["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
            bump(inner, &mut pod);
            record(inner, namespace, "pods", "MODIFIED", &pod);
            inner.objects.insert(key, pod.clone());
            Ok(pod)
        }
        Some(proc) => {
            let _ = proc.child.kill();
            proc.kill_at = Some(Instant::now());
            let pod = object;
            remove_pod(inner, namespace, name);
            Ok(pod)
        }
        None => {
            remove_pod(inner, namespace, name);
            Ok(object)
        }
    }
}

fn status_success(kind: &str, name: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
           "details": {"name": name, "kind": kind}})
}

// ---- the kubelet ----------------------------------------------------------------------------

fn kubelet(state: Arc<State>) {
    while !state.stop.load(Ordering::SeqCst) {
        {
            let mut inner = state.lock();
            let changed = kubelet_pass(&state, &mut inner);
            drop(inner);
            if changed {
                state.changed.notify_all();
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn set_status(inner: &mut Inner, namespace: &str, name: &str, f: impl FnOnce(&mut Value)) {
    let key = ("pods".to_string(), namespace.to_string(), name.to_string());
    if let Some(mut pod) = inner.objects.get(&key).cloned() {
        f(&mut pod);
        bump(inner, &mut pod);
        record(inner, namespace, "pods", "MODIFIED", &pod);
        inner.objects.insert(key, pod);
    }
}

fn kubelet_pass(state: &State, inner: &mut Inner) -> bool {
    let mut changed = reap_exits(inner);
    for (ns, name, pod) in pending_pods(inner) {
        changed |= start_pod(state, inner, &ns, &name, &pod);
    }
    changed
}

/// Kills the processes past their `kill_at` and records the exits: the pod's phase and its
/// container's terminated state; a pod being deleted goes once its process has exited.
fn reap_exits(inner: &mut Inner) -> bool {
    let mut changed = false;
    let mut exited = Vec::new();
    for (key, proc) in inner.procs.iter_mut() {
        if proc.kill_at.is_some_and(|at| Instant::now() >= at) {
            let _ = proc.child.kill();
        }
        if let Ok(Some(status)) = proc.child.try_wait() {
            use std::os::unix::process::ExitStatusExt;
            let code = status
                .code()
                .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
            exited.push((key.clone(), code));
        }
    }
    for ((ns, name), code) in exited {
        inner.procs.remove(&(ns.clone(), name.clone()));
        changed = true;
        let deleting = inner
            .objects
            .get(&("pods".to_string(), ns.clone(), name.clone()))
            .is_some_and(|p| !p["metadata"]["deletionTimestamp"].is_null());
        set_status(inner, &ns, &name, |pod| {
            let phase = if code == 0 { "Succeeded" } else { "Failed" };
            pod["status"]["phase"] = json!(phase);
            pod["status"]["containerStatuses"] = json!([{
                "name": pod["spec"]["containers"][0]["name"],
                "image": pod["spec"]["containers"][0]["image"],
                "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {
                    "exitCode": code,
                    "reason": if code == 0 { "Completed" } else { "Error" },
                    "startedAt": pod["status"]["startTime"], "finishedAt": now_rfc3339(),
                }},
            }]);
        });
        if deleting {
            remove_pod(inner, &ns, &name);
        }
    }
    changed
}

/// The pending pods to start: not being deleted, not marked unschedulable, with no process.
fn pending_pods(inner: &Inner) -> Vec<(String, String, Value)> {
    inner
        .objects
        .iter()
        .filter(|((kind, ns, name), pod)| {
            kind == "pods"
                && pod["status"]["phase"] == "Pending"
                && pod["metadata"]["deletionTimestamp"].is_null()
                && !inner.unschedulable.contains(&(ns.clone(), name.clone()))
                && !inner.procs.contains_key(&(ns.clone(), name.clone()))
        })
        .map(|((_, ns, name), pod)| (ns.clone(), name.clone(), pod.clone()))
        .collect()
}

/// Starts one pending pod's first container as a process; a missing Secret leaves it waiting
/// in `CreateContainerConfigError`, no command fails it. Whether the pod changed.
fn start_pod(state: &State, inner: &mut Inner, ns: &str, name: &str, pod: &Value) -> bool {
    let container = &pod["spec"]["containers"][0];
    let env = match container_env(inner, ns, container) {
        Ok(env) => env,
        Err(message) => return mark_config_error(inner, ns, name, pod, message),
    };
    let argv = container_argv(container);
    if argv.is_empty() {
        set_status(inner, ns, name, |pod| {
            pod["status"]["phase"] = json!("Failed");
            pod["status"]["message"] = json!("the test double runs only pods with a command");
        });
        return true;
    }
    spawn_pod(state, inner, ns, name, &argv, env);
    true
}

/// The container's environment, its `secretKeyRef`s read from the Secrets; the error names the
/// (last) missing one.
fn container_env(
    inner: &Inner,
    ns: &str,
    container: &Value,
) -> Result<Vec<(String, String)>, String> {
    let mut env: Vec<(String, String)> = Vec::new();
    let mut missing = None;
    for e in container["env"].as_array().into_iter().flatten() {
        let key = e["name"].as_str().unwrap_or("").to_string();
        if let Some(value) = e["value"].as_str() {
            env.push((key, value.to_string()));
        } else if let Some(r) = e["valueFrom"]["secretKeyRef"].as_object() {
            let secret = r.get("name").and_then(Value::as_str).unwrap_or("");
            let field = r.get("key").and_then(Value::as_str).unwrap_or("");
            let value = inner
                .objects
                .get(&("secrets".to_string(), ns.to_string(), secret.to_string()))
                .and_then(|s| s["data"][field].as_str())
                .and_then(|v| base64::engine::general_purpose::STANDARD.decode(v).ok());
            match value {
                Some(v) => env.push((key, String::from_utf8_lossy(&v).into_owned())),
                None => missing = Some(format!("secret \"{secret}\" (key {field}) not found")),
            }
        }
    }
    match missing {
        Some(message) => Err(message),
        None => Ok(env),
    }
}

/// Marks the pod's container waiting in `CreateContainerConfigError` (once); whether it changed.
fn mark_config_error(
    inner: &mut Inner,
    ns: &str,
    name: &str,
    pod: &Value,
    message: String,
) -> bool {
    let already = pod["status"]["containerStatuses"][0]["state"]["waiting"]["reason"]
        == "CreateContainerConfigError";
    if already {
        return false;
    }
    set_status(inner, ns, name, |pod| {
        pod["status"]["containerStatuses"] = json!([{
            "name": pod["spec"]["containers"][0]["name"], "ready": false,
            "restartCount": 0, "image": pod["spec"]["containers"][0]["image"], "imageID": "",
            "state": {"waiting": {"reason": "CreateContainerConfigError", "message": message}},
        }]);
    });
    true
}

/// The container's `command` then its `args`.
fn container_argv(container: &Value) -> Vec<String> {
    let words = |field: &str| -> Vec<String> {
        container[field]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(String::from))
            .collect()
    };
    let mut argv = words("command");
    argv.extend(words("args"));
    argv
}

/// Runs `argv` as the pod's process (stderr to its log) and marks it Running, or Failed with
/// a `StartError` if it cannot start.
fn spawn_pod(
    state: &State,
    inner: &mut Inner,
    ns: &str,
    name: &str,
    argv: &[String],
    env: Vec<(String, String)>,
) {
    let log = std::fs::File::create(state.log_dir.join(format!("{name}.log")));
    let mut command = Command::new(&argv[0]);
    command
        .args(&argv[1..])
        .env_clear()
        .envs(std::env::vars().filter(|(k, _)| k == "PATH" || k == "RUST_LOG"))
        .envs(env)
        .env("HOSTNAME", name)
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    match log {
        Ok(file) => command.stderr(file),
        Err(_) => command.stderr(Stdio::null()),
    };
    match command.spawn() {
        Ok(child) => {
            let proc = Proc {
                child,
                kill_at: None,
            };
            inner.procs.insert((ns.to_string(), name.to_string()), proc);
            set_status(inner, ns, name, mark_running);
        }
        Err(error) => set_status(inner, ns, name, |pod| {
            pod["status"]["phase"] = json!("Failed");
            pod["status"]["containerStatuses"] = json!([{
                "name": pod["spec"]["containers"][0]["name"], "ready": false, "restartCount": 0,
                "image": pod["spec"]["containers"][0]["image"], "imageID": "",
                "state": {"terminated": {"exitCode": 128, "reason": "StartError",
                          "message": error.to_string()}},
            }]);
        }),
    }
}

/// A started pod's status: on the double's node, Running, its container ready.
fn mark_running(pod: &mut Value) {
    let now = now_rfc3339();
    pod["spec"]["nodeName"] = json!("double-node");
    pod["status"]["phase"] = json!("Running");
    pod["status"]["podIP"] = json!("127.0.0.1");
    pod["status"]["hostIP"] = json!("127.0.0.1");
    pod["status"]["startTime"] = json!(now);
    pod["status"]["containerStatuses"] = json!([{
        "name": pod["spec"]["containers"][0]["name"],
        "image": pod["spec"]["containers"][0]["image"], "imageID": "",
        "ready": true, "restartCount": 0, "started": true,
        "state": {"running": {"startedAt": now}},
    }]);
}

// ---- HTTP -----------------------------------------------------------------------------------

struct Request {
    method: String,
    path: String,
    query: BTreeMap<String, String>,
    body: Vec<u8>,
    close: bool,
}

fn read_request(reader: &mut BufReader<TcpStream>) -> Option<Result<Request, u16>> {
    let mut line = String::new();
    if reader.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_string();
    let target = parts.next()?.to_string();
    let version = parts.next().unwrap_or("HTTP/1.1").to_string();
    let mut length = 0usize;
    let mut close = version == "HTTP/1.0";
    let mut chunked = false;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header).ok()? == 0 {
            return None;
        }
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((k, v)) = header.split_once(':') {
            let v = v.trim();
            match k.trim().to_ascii_lowercase().as_str() {
                "content-length" => length = v.parse().unwrap_or(0),
                "connection" => close = v.eq_ignore_ascii_case("close"),
                "transfer-encoding" => chunked = true,
                _ => {}
            }
        }
    }
    if chunked {
        return Some(Err(411));
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p.to_string(), q),
        None => (target.clone(), ""),
    };
    let query = query
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) => (percent_decode(k), percent_decode(v)),
            None => (percent_decode(kv), String::new()),
        })
        .collect();
    Some(Ok(Request {
        method,
        path,
        query,
        body,
        close,
    }))
}

fn respond(stream: &mut TcpStream, code: u16, body: &Value, extra: &str) -> std::io::Result<()> {
    let body = body.to_string();
    let head = format!(
        "HTTP/1.1 {code} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{extra}\r\n",
        reason_phrase(code),
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body.as_bytes())?;
    stream.flush()
}

fn reason_phrase(code: u16) -> &'static str {
    match code {
        200 => "OK",
        201 => "Created",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        410 => "Gone",
        411 => "Length Required",
        422 => "Unprocessable Entity",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Unknown",
    }
}

fn error_response(stream: &mut TcpStream, (code, message): ApiError) -> std::io::Result<()> {
    let extra = if code == 429 {
        "Retry-After: 1\r\n"
    } else {
        ""
    };
    respond(
        stream,
        code,
        &status(code, reason_of(code), &message),
        extra,
    )
}

fn serve(state: Arc<State>, stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let Ok(read_half) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(read_half);
    let mut stream = stream;
    while !state.stop.load(Ordering::SeqCst) {
        let request = match read_request(&mut reader) {
            None => return,
            Some(Err(code)) => {
                let _ = error_response(&mut stream, (code, "unsupported request".into()));
                return;
            }
            Some(Ok(request)) => request,
        };
        let close = request.close;
        match handle(&state, &mut stream, request) {
            Ok(true) if !close => {}
            _ => return,
        }
    }
}

/// Answers one request; false when the connection must close.
fn handle(state: &Arc<State>, stream: &mut TcpStream, request: Request) -> std::io::Result<bool> {
    let (delay, fail) = injected(state);
    if let Some(delay) = delay {
        std::thread::sleep(delay);
    }
    if let Some(code) = fail {
        error_response(stream, (code, "injected by the test double".into()))?;
        return Ok(true);
    }
    let segments: Vec<&str> = request.path.trim_matches('/').split('/').collect();
    let version = state.lock().version.clone();
    if let Some(document) = discovery(&segments, version) {
        respond(stream, 200, &document, "")?;
        return Ok(true);
    }
    let (namespace, kind, name) = match segments.as_slice() {
        ["api", "v1", "namespaces", ns, kind] if is_served(kind) => (*ns, *kind, None),
        ["api", "v1", "namespaces", ns, kind, name] if is_served(kind) => (*ns, *kind, Some(*name)),
        _ => {
            error_response(
                stream,
                (
                    404,
                    "the server could not find the requested resource".into(),
                ),
            )?;
            return Ok(true);
        }
    };
    let (namespace, kind) = (namespace.to_string(), kind.to_string());
    let watching = matches!(
        request.query.get("watch").map(String::as_str),
        Some("true" | "1")
    );
    let result = match (request.method.as_str(), name) {
        ("GET", None) if watching => {
            if kind != "pods" {
                error_response(stream, (405, "the double watches only pods".into()))?;
                return Ok(true);
            }
            return watch(state, stream, &namespace, &request.query);
        }
        ("GET", None) => list(state, &namespace, &kind, &request.query).map(|body| (200, body)),
        ("GET", Some(name)) => get(state, &kind, &namespace, name).map(|object| (200, object)),
        ("POST", None) => post(state, &kind, &namespace, &request.body).map(|o| (201, o)),
        ("DELETE", Some(name)) => delete_request(state, &kind, &namespace, name, &request),
        _ => Err((405, "method not allowed".into())),
    };
    match result {
        Ok((code, object)) => respond(stream, code, &object, "")?,
        Err(e) => error_response(stream, e)?,
    }
    Ok(true)
}

/// The Kubernetes version the double answers as (`/version`): the one k8s-openapi's feature
/// names (`v1_30`).
pub const SERVED_VERSION: (&str, &str) = ("1", "30");

/// The discovery documents a client such as kubectl reads before anything else: `/version`,
/// `/api` (core v1 only), `/apis` (no groups) and `/api/v1` (pods and secrets).
fn discovery(segments: &[&str], version: Option<(String, String)>) -> Option<Value> {
    let resource = |name: &str, kind: &str, verbs: &[&str], short: &[&str]| {
        json!({"name": name, "singularName": kind.to_lowercase(), "namespaced": true,
               "kind": kind, "verbs": verbs, "shortNames": short})
    };
    let served = (SERVED_VERSION.0.to_owned(), SERVED_VERSION.1.to_owned());
    let (major, minor) = version.unwrap_or(served);
    Some(match segments {
        ["version"] => json!({"major": major, "minor": minor,
            "gitVersion": format!("v{major}.{minor}.0-flint-double"), "platform": "linux/amd64"}),
        ["api"] => json!({"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ""}]}),
        ["apis"] => json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": []}),
        ["api", "v1"] => json!({"kind": "APIResourceList", "groupVersion": "v1", "resources": [
            resource("pods", "Pod", &["create", "delete", "get", "list", "watch"], &["po"]),
            resource("secrets", "Secret", &["create", "delete", "get", "list"], &[]),
        ]}),
        _ => return None,
    })
}

/// The kinds the double serves.
fn is_served(kind: &str) -> bool {
    kind == "pods" || kind == "secrets"
}

/// Counts the request; the injected delay and failure code in force, if any.
fn injected(state: &State) -> (Option<Duration>, Option<u16>) {
    let mut inner = state.lock();
    inner.counters.requests += 1;
    let now = Instant::now();
    let delay = inner.slow.filter(|(until, _)| now < *until).map(|(_, d)| d);
    let fail = inner.fail.filter(|(until, _)| now < *until).map(|(_, c)| c);
    if fail.is_some() {
        inner.counters.injected += 1;
    }
    (delay, fail)
}

/// `GET` of one object.
fn get(state: &State, kind: &str, namespace: &str, name: &str) -> Result<Value, ApiError> {
    let inner = state.lock();
    inner
        .objects
        .get(&(kind.to_string(), namespace.to_string(), name.to_string()))
        .cloned()
        .ok_or_else(|| (404, format!("{kind} \"{name}\" not found")))
}

/// `POST`: creates the object in the body.
fn post(state: &State, kind: &str, namespace: &str, body: &[u8]) -> Result<Value, ApiError> {
    let body: Value =
        serde_json::from_slice(body).map_err(|e| (400, format!("the body is not JSON: {e}")))?;
    let result = {
        let mut inner = state.lock();
        create(&mut inner, kind, namespace, body)
    };
    state.changed.notify_all();
    result
}

/// `DELETE` of one object, its grace period from the query or the body's options.
fn delete_request(
    state: &State,
    kind: &str,
    namespace: &str,
    name: &str,
    request: &Request,
) -> Result<(u16, Value), ApiError> {
    let options: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
    let grace = request
        .query
        .get("gracePeriodSeconds")
        .and_then(|g| g.parse().ok())
        .or_else(|| options["gracePeriodSeconds"].as_u64());
    let result = {
        let mut inner = state.lock();
        delete(&mut inner, kind, namespace, name, grace)
    };
    state.changed.notify_all();
    result.map(|object| (200, object))
}

fn selectors(
    kind: &str,
    query: &BTreeMap<String, String>,
) -> Result<(Vec<Requirement>, Vec<FieldReq>), ApiError> {
    let labels = parse_labels(query.get("labelSelector").map_or("", String::as_str))
        .map_err(|e| (400, format!("unable to parse labelSelector: {e}")))?;
    let fields = parse_fields(kind, query.get("fieldSelector").map_or("", String::as_str))
        .map_err(|e| (400, e))?;
    Ok((labels, fields))
}

fn list(
    state: &State,
    namespace: &str,
    kind: &str,
    query: &BTreeMap<String, String>,
) -> Result<Value, ApiError> {
    let (labels, fields) = selectors(kind, query)?;
    let mut inner = state.lock();
    if let Some(rv) = query
        .get("resourceVersion")
        .filter(|v| !v.is_empty() && *v != "0")
    {
        let rv: u64 = rv
            .parse()
            .map_err(|_| (400, format!("invalid resourceVersion {rv:?}")))?;
        if rv > inner.rv {
            return Err((
                504,
                format!("Too large resource version: {rv}, current: {}", inner.rv),
            ));
        }
    }
    if kind == "pods" {
        inner.counters.pod_lists += 1;
    }
    let items: Vec<Value> = inner
        .objects
        .iter()
        .filter(|((k, ns, _), o)| {
            k == kind && ns == namespace && labels_match(&labels, o) && fields_match(&fields, o)
        })
        .map(|(_, o)| o.clone())
        .collect();
    let list_kind = if kind == "pods" {
        "PodList"
    } else {
        "SecretList"
    };
    let mut list = json!({"kind": list_kind, "apiVersion": "v1",
              "metadata": {"resourceVersion": inner.rv.to_string()}, "items": items});
    if let (Some(field), Some(list)) = (&inner.omitted, list.as_object_mut()) {
        list.remove(field);
    }
    Ok(list)
}

fn write_chunk(stream: &mut TcpStream, data: &[u8]) -> std::io::Result<()> {
    stream.write_all(format!("{:x}\r\n", data.len()).as_bytes())?;
    stream.write_all(data)?;
    stream.write_all(b"\r\n")?;
    stream.flush()
}

fn event_line(kind: &str, object: &Value) -> Vec<u8> {
    let mut line = json!({"type": kind, "object": object})
        .to_string()
        .into_bytes();
    line.push(b'\n');
    line
}

/// A watch stream; false (close the connection) when it was cut.
fn watch(
    state: &Arc<State>,
    stream: &mut TcpStream,
    namespace: &str,
    query: &BTreeMap<String, String>,
) -> std::io::Result<bool> {
    let (labels, fields) = match selectors("pods", query) {
        Ok(s) => s,
        Err(e) => {
            error_response(stream, e)?;
            return Ok(true);
        }
    };
    let selected = |ns: &str, o: &Value| {
        ns == namespace && labels_match(&labels, o) && fields_match(&fields, o)
    };
    let timeout = query
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .unwrap_or(1800);
    let end = Instant::now() + Duration::from_secs(timeout);
    let requested = query.get("resourceVersion").cloned().unwrap_or_default();
    let mut inner = state.lock();
    inner.counters.watches += 1;
    let epoch = inner.cut_epoch;
    let mut initial = Vec::new();
    let from = match requested.as_str() {
        "" | "0" => {
            for ((k, ns, _), o) in inner.objects.iter() {
                if k == "pods" && selected(ns, o) {
                    initial.push(event_line("ADDED", o));
                }
            }
            inner.rv
        }
        rv => match rv.parse::<u64>() {
            Ok(rv) => rv,
            Err(_) => {
                drop(inner);
                error_response(stream, (400, format!("invalid resourceVersion {rv:?}")))?;
                return Ok(true);
            }
        },
    };
    let too_old = from < inner.oldest_rv;
    if too_old {
        inner.counters.gone += 1;
    }
    let oldest = inner.oldest_rv;
    drop(inner);
    stream.write_all(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
    )?;
    if too_old {
        return end_gone(stream, from, oldest);
    }
    for line in initial {
        write_chunk(stream, &line)?;
    }
    follow(state, stream, &selected, from, epoch, end)
}

/// Ends a watch stream with a 410 `Expired` event: `from` is older than the history kept.
fn end_gone(stream: &mut TcpStream, from: u64, oldest: u64) -> std::io::Result<bool> {
    let gone = status(
        410,
        "Expired",
        &format!("too old resource version: {from} ({oldest})"),
    );
    write_chunk(stream, &event_line("ERROR", &gone))?;
    stream.write_all(b"0\r\n\r\n")?;
    Ok(true)
}

/// Streams the selected events after `from` until the watch's `end` (a terminating chunk),
/// a cut (none) or a compaction past `from` (410).
fn follow(
    state: &Arc<State>,
    stream: &mut TcpStream,
    selected: &dyn Fn(&str, &Value) -> bool,
    mut from: u64,
    epoch: u64,
    end: Instant,
) -> std::io::Result<bool> {
    loop {
        let mut inner = match wait_for_events(state, epoch, end, from) {
            Waited::Cut => {
                // Cut: no terminating chunk.
                let _ = stream.shutdown(std::net::Shutdown::Both);
                return Ok(false);
            }
            Waited::End => {
                stream.write_all(b"0\r\n\r\n")?;
                return Ok(true);
            }
            Waited::Events(inner) => inner,
        };
        if from < inner.oldest_rv {
            // Compacted while watching: the real server ends such a watch with 410.
            inner.counters.gone += 1;
            let oldest = inner.oldest_rv;
            drop(inner);
            return end_gone(stream, from, oldest);
        }
        let lines: Vec<Vec<u8>> = inner
            .history
            .iter()
            .filter(|(rv, ns, _, o)| *rv > from && selected(ns, o))
            .map(|(_, _, kind, o)| event_line(kind, o))
            .collect();
        from = inner.history.back().map_or(from, |(rv, ..)| *rv);
        drop(inner);
        for line in lines {
            write_chunk(stream, &line)?;
        }
    }
}

/// How a watch's wait for history ended.
enum Waited<'a> {
    /// The double stopped or the watches were cut.
    Cut,
    /// The watch's timeout passed.
    End,
    /// History newer than the watch's `from`, under the lock.
    Events(MutexGuard<'a, Inner>),
}

/// Waits (in 50 ms steps) for history after `from`, a cut or the watch's `end`.
fn wait_for_events(state: &State, epoch: u64, end: Instant, from: u64) -> Waited<'_> {
    let mut inner = state.lock();
    loop {
        if state.stop.load(Ordering::SeqCst) || inner.cut_epoch != epoch {
            inner.counters.cut += u64::from(inner.cut_epoch != epoch);
            return Waited::Cut;
        }
        if Instant::now() >= end {
            return Waited::End;
        }
        if inner.history.back().is_some_and(|(rv, ..)| *rv > from) {
            return Waited::Events(inner);
        }
        inner = state
            .changed
            .wait_timeout(inner, Duration::from_millis(50))
            .map(|(guard, _)| guard)
            .unwrap_or_else(|p| p.into_inner().0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_selectors_parse_and_match() {
        let pod = json!({"metadata": {"labels": {"a": "1", "b": "x"}}});
        let ok = |s: &str| labels_match(&parse_labels(s).unwrap(), &pod);
        assert!(ok("a=1,b==x"));
        assert!(ok("a in (1,2),c notin (3)"));
        assert!(ok("a,!c"));
        assert!(!ok("a!=1"));
        assert!(parse_labels("a=(").is_err());
        assert!(parse_labels("-a=1").is_err());
    }

    #[test]
    fn unsupported_field_selectors_are_refused() {
        assert!(parse_fields("pods", "status.phase=Running").is_ok());
        assert!(parse_fields("pods", "spec.containers=x").is_err());
        assert!(parse_fields("secrets", "status.phase=Running").is_err());
    }

    #[test]
    fn invalid_pods_are_refused() {
        let mut inner = Inner::default();
        let pod = |name: &str| json!({"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "i"}]}});
        assert!(create(&mut inner, "pods", "ns", pod("ok")).is_ok());
        assert_eq!(
            create(&mut inner, "pods", "ns", pod("ok")).unwrap_err().0,
            409
        );
        assert_eq!(
            create(&mut inner, "pods", "ns", pod("Not_Valid"))
                .unwrap_err()
                .0,
            422
        );
        let no_image = json!({"metadata": {"name": "x"}, "spec": {"containers": [{"name": "c"}]}});
        assert_eq!(
            create(&mut inner, "pods", "ns", no_image).unwrap_err().0,
            422
        );
        let other_ns = json!({"metadata": {"name": "y", "namespace": "other"}, "spec": {"containers": [{"name": "c", "image": "i"}]}});
        assert_eq!(
            create(&mut inner, "pods", "ns", other_ns).unwrap_err().0,
            400
        );
        let both = json!({"metadata": {"name": "z"}, "spec": {"containers": [{"name": "c", "image": "i",
            "env": [{"name": "A", "value": "1", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}]}});
        assert_eq!(create(&mut inner, "pods", "ns", both).unwrap_err().0, 422);
        let owner = json!({"metadata": {"name": "o", "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "d"}]},
            "spec": {"containers": [{"name": "c", "image": "i"}]}});
        assert_eq!(
            create(&mut inner, "pods", "ns", owner).unwrap_err().0,
            422,
            "no uid"
        );
    }

    #[test]
    fn timestamps_are_rfc3339() {
        let t = now_rfc3339();
        assert_eq!(t.len(), 20);
        assert!(t.ends_with('Z') && t.as_bytes()[10] == b'T');
    }
}
