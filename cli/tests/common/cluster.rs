//! The standalone cluster with real processes, for the tests that start one (`standalone.rs`,
//! `attacks.rs`): `flint` processes killed on drop, a master and workers with fast timeouts on
//! 127.0.0.x, status snapshots, `flint submit` and its checks, application clients.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use flint_cli::summary::indexed_payload;
use flint_engine::functions::fnv1a64;
use flint_engine::standalone::AppSpec;
use flint_net::handshake::Secret;
use flint_net::standalone::app_client::{AppClient, AppClientConfig};
use flint_net::standalone::BlockingClient;
use flint_net::wire::{Message, Role};

use super::{free_port, unique, wait_until, Gate, DEADLINE};

pub const FLINT: &str = env!("CARGO_BIN_EXE_flint");

/// The shared secret of the test clusters: every `flint` process gets it as $FLINT_SECRET.
pub const SECRET: &str = "standalone-test-secret";

pub fn secret() -> Option<Secret> {
    Some(Secret::new(SECRET).expect("non-empty"))
}

/// A test's scratch directory: removed when it is dropped, unless the test is failing (then
/// it stays, with the processes' output in it, for whoever reads the failure).
pub struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

pub fn scratch(name: &str) -> Scratch {
    let dir = std::env::temp_dir().join(format!(
        "flint-sa-{}-{name}-{}",
        std::process::id(),
        unique()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    Scratch(dir)
}

/// A `flint` process with stdout and stderr in files; killed on drop.
pub struct Proc {
    pub name: String,
    /// Where it listens, for workers.
    pub listen: Option<SocketAddr>,
    pub child: Child,
    pub stdout: PathBuf,
    pub stderr: PathBuf,
}

impl Proc {
    pub fn start(dir: &Path, name: &str, args: &[&str]) -> Proc {
        let mut command = Command::new(FLINT);
        command.env("FLINT_SECRET", SECRET);
        Proc::start_with(command, dir, name, args)
    }

    /// Starts `flint ARGS` with `FLINT_SECRET` set to `secret` and `env` added.
    pub fn start_env(
        dir: &Path,
        name: &str,
        secret: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Proc {
        let mut command = Command::new(FLINT);
        command.env("FLINT_SECRET", secret);
        for (k, v) in env {
            command.env(k, v);
        }
        Proc::start_with(command, dir, name, args)
    }

    /// The observe token the process printed the file of.
    pub fn observe_token(&self) -> String {
        super::wait_observe_token(|| self.stderr())
    }

    pub fn start_with(mut command: Command, dir: &Path, name: &str, args: &[&str]) -> Proc {
        let stdout = dir.join(format!("{name}-{}.out", unique()));
        let stderr = dir.join(format!("{name}-{}.err", unique()));
        let child = command
            .args(args)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout).expect("stdout file"))
            .stderr(std::fs::File::create(&stderr).expect("stderr file"))
            .spawn()
            .expect("spawn flint");
        Proc {
            name: name.into(),
            listen: None,
            child,
            stdout,
            stderr,
        }
    }

    pub fn stdout(&self) -> String {
        std::fs::read_to_string(&self.stdout).unwrap_or_default()
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    pub fn wait(&mut self) -> ExitStatus {
        let deadline = Instant::now() + DEADLINE * 2;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not exit; stderr: {}",
                self.name,
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn kill9(&mut self) {
        kill("-KILL", &self.child.id().to_string());
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    /// SIGTERM first, so that a master or worker cleans up as it would for an operator (its
    /// generated token directory, its executors); SIGKILL if it is still there 5 s later.
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            kill("-TERM", &self.child.id().to_string());
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline && matches!(self.child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn kill(signal: &str, target: &str) -> bool {
    Command::new("kill")
        .args([signal, "--", target])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A master on 127.0.0.1 with fast timeouts.
pub fn start_master(dir: &Path, port: u16, extra: &[&str]) -> Proc {
    let listen = format!("127.0.0.1:{port}");
    let mut args = vec![
        "master",
        "--listen",
        &listen,
        "--worker-timeout-ms",
        "2000",
        "--heartbeat-interval-ms",
        "200",
        "--recovery-timeout-ms",
        "5000",
    ];
    args.extend_from_slice(extra);
    let master = Proc::start(dir, "master", &args);
    let addr: SocketAddr = listen.parse().expect("addr");
    wait_until("the master to listen", || {
        std::net::TcpStream::connect(addr).is_ok()
    });
    master
}

/// A worker listening (for status) on `host` and a free port, with its work dir under `dir`.
pub fn start_worker(dir: &Path, master: u16, id: &str, host: &str, cores: u32) -> Proc {
    start_worker_allowing(dir, master, id, host, cores, &[])
}

/// A worker that also lets applications run `commands` as executors.
pub fn start_worker_allowing(
    dir: &Path,
    master: u16,
    id: &str,
    host: &str,
    cores: u32,
    commands: &[&str],
) -> Proc {
    let work = dir.join(format!("work-{id}"));
    let listen: SocketAddr = format!("{host}:{}", free_port()).parse().expect("addr");
    let mut args: Vec<&str> = Vec::new();
    for command in commands {
        args.extend(["--allow-command", command]);
    }
    let (master, cores, work) = (
        format!("127.0.0.1:{master}"),
        cores.to_string(),
        work.to_string_lossy().into_owned(),
    );
    let listen_arg = listen.to_string();
    let mut all = vec![
        "worker",
        "--master",
        &master,
        "--id",
        id,
        "--cores",
        &cores,
        "--memory-mb",
        "4096",
        "--listen",
        &listen_arg,
        "--work-dir",
        &work,
        "--kill-timeout-ms",
        "1000",
    ];
    all.extend(args);
    let mut worker = Proc::start(dir, id, &all);
    worker.listen = Some(listen);
    worker
}

#[derive(Debug, Default)]
pub struct Snapshot {
    /// (id, state)
    pub workers: Vec<(String, String)>,
    /// (id, state)
    pub apps: Vec<(String, String)>,
    /// (app, executor, worker, state)
    pub executors: Vec<(String, String, String, String)>,
}

impl Snapshot {
    pub fn worker_state(&self, id: &str) -> Option<&str> {
        self.workers
            .iter()
            .find(|(w, _)| w == id)
            .map(|(_, s)| s.as_str())
    }

    pub fn alive_workers(&self) -> usize {
        self.workers.iter().filter(|(_, s)| s == "ALIVE").count()
    }

    pub fn running_on(&self, worker: &str) -> usize {
        self.executors
            .iter()
            .filter(|(_, _, w, s)| w == worker && s == "RUNNING")
            .count()
    }
}

pub fn status(port: u16) -> Option<Snapshot> {
    status_of(SocketAddr::from(([127, 0, 0, 1], port)))
}

/// The status a master (or a worker) answers.
pub fn status_of(addr: SocketAddr) -> Option<Snapshot> {
    status_with(addr, secret())
}

/// The status a master (or a worker) answers to a client proving `secret`.
pub fn status_with(addr: SocketAddr, secret: Option<Secret>) -> Option<Snapshot> {
    let mut client =
        BlockingClient::connect(addr, Role::Client, secret, Duration::from_secs(5)).ok()?;
    client.send(&Message::StatusRequest {}).ok()?;
    let frame = client.next_frame().ok()?;
    let Ok(Message::StatusResponse {
        workers,
        applications,
        executors,
    }) = frame.message()
    else {
        return None;
    };
    Some(Snapshot {
        workers: workers
            .iter()
            .map(|w| (w.worker_id.to_owned(), w.state.to_string().to_uppercase()))
            .collect(),
        apps: applications
            .iter()
            .map(|a| (a.app_id.to_owned(), a.state.to_string().to_uppercase()))
            .collect(),
        executors: executors
            .iter()
            .map(|e| {
                (
                    e.app_id.to_owned(),
                    e.executor_id.to_owned(),
                    e.worker_id.to_owned(),
                    e.state.to_string().to_uppercase(),
                )
            })
            .collect(),
    })
}

pub fn wait_status(
    port: u16,
    what: &str,
    mut condition: impl FnMut(&Snapshot) -> bool,
) -> Snapshot {
    let mut last = None;
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(snapshot) = status(port) {
            if condition(&snapshot) {
                return snapshot;
            }
            last = Some(snapshot);
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; last status: {last:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub fn expected_checksum(tasks: u64, payload: usize) -> u64 {
    (0..tasks).fold(0u64, |sum, i| {
        sum.wrapping_add(fnv1a64(&indexed_payload(i, payload)))
    })
}

pub fn submit(dir: &Path, master: u16, executors: u32, tasks: u64, task: &str) -> Proc {
    submit_with(dir, master, executors, tasks, task, &[])
}

/// [`submit`] with `extra` arguments.
pub fn submit_with(
    dir: &Path,
    master: u16,
    executors: u32,
    tasks: u64,
    task: &str,
    extra: &[&str],
) -> Proc {
    let (master, executors, tasks) = (
        format!("127.0.0.1:{master}"),
        executors.to_string(),
        tasks.to_string(),
    );
    let args = [
        "submit",
        "--master",
        &master,
        "--executors",
        &executors,
        "--cores",
        "1",
        "--tasks",
        &tasks,
        "--task",
        task,
        "--payload",
        "8",
        "--tasks-per-core",
        "4",
        "--wait-s",
        "30",
        "--json",
    ];
    Proc::start(dir, "submit", &[&args[..], extra].concat())
}

/// A free loopback address for a `flint submit`'s `--metrics-listen`; its metrics take the
/// observe token it prints the file of (`super::wait_observe_token`).
pub fn metrics_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], free_port()))
}

/// Waits for `flint submit` to exit 0 and checks its checksum; returns its JSON line.
pub fn submit_succeeds(submit: &mut Proc, tasks: u64) -> String {
    let status = submit.wait();
    let stdout = submit.stdout();
    assert!(
        status.success(),
        "submit failed: stdout {stdout} stderr {}",
        submit.stderr()
    );
    assert!(
        stdout.contains(&format!("\"checksum\":{}", expected_checksum(tasks, 8))),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("\"succeeded\":{tasks}")),
        "{stdout}"
    );
    stdout
}

pub fn json_u64(json: &str, key: &str) -> Option<u64> {
    let rest = json.split(&format!("\"{key}\":")).nth(1)?;
    rest.split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// Pids of the executors a worker started (from the `pid` files in its work dir).
pub fn executor_pids(work: &Path) -> Vec<String> {
    let mut pids = Vec::new();
    for app in std::fs::read_dir(work).into_iter().flatten().flatten() {
        for executor in std::fs::read_dir(app.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            if let Ok(pid) = std::fs::read_to_string(executor.path().join("pid")) {
                pids.push(pid.trim().to_owned());
            }
        }
    }
    pids
}

/// A shell loop (for an executor command `sh -c`) that ends once `gate` opens: the executor
/// stays up for exactly as long as the test needs it, and no longer.
pub fn until_open(gate: &Gate) -> String {
    format!(
        "while [ ! -e '{}' ]; do sleep 0.05; done",
        gate.path().display()
    )
}

pub fn status_now(port: u16) -> Snapshot {
    status(port).expect("status answers")
}

pub fn app_client(port: u16, spec: AppSpec, executors: u32) -> AppClient {
    let client = AppClient::start(AppClientConfig {
        master: SocketAddr::from(([127, 0, 0, 1], port)),
        secret: secret(),
        spec,
        executors: Some(executors),
        reconnect_max: Duration::from_millis(500),
    })
    .expect("app client");
    client.wait_registered(DEADLINE).expect("registered");
    client
}

/// Runs `flint ARGS` to its end with `env` (and no inherited secret); its exit code, stdout and
/// stderr. A process still running after the deadline is killed and fails the test.
pub fn flint_output(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let dir = std::env::temp_dir();
    let mut command = Command::new(FLINT);
    command.env_remove("FLINT_SECRET");
    for (key, value) in env {
        command.env(key, value);
    }
    let mut proc = Proc::start_with(command, &dir, "flint-output", args);
    let deadline = Instant::now() + DEADLINE;
    let status = loop {
        if let Some(status) = proc.child.try_wait().expect("try_wait") {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "flint {args:?} did not exit; stderr: {}",
            proc.stderr()
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let output = (status.code(), proc.stdout(), proc.stderr());
    let _ = std::fs::remove_file(&proc.stdout);
    let _ = std::fs::remove_file(&proc.stderr);
    output
}
