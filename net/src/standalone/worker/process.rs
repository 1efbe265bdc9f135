//! The worker's process supervision (Spark's `ExecutorRunner`): starting an executor's process
//! in its directory, a thread per child that waits for its exit, killing (`SIGTERM` to the
//! process group, `SIGKILL` after `kill_timeout`), cleaning up a finished application's
//! directory, and killing what a previous run of this worker left behind. What each change is
//! reported as goes to the [`Session`]; the endpoint ([`super::endpoint`]) sends it.

use std::collections::{HashMap, HashSet};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Command, Stdio};

use flint_engine::runtime::{Ctx, EndpointRef, TimerId};

use super::endpoint::WorkerEndpoint;
use super::session::{Report, Session};
use super::{WorkerConfig, WorkerMsg};
use crate::handshake::SECRET_ENV;
use crate::transport::send_retrying;
use crate::wire::{self, ProcessState};

/// An executor's key: its application's id and its own.
pub(super) type Key = (String, String);

/// A running executor.
pub(super) struct Running {
    pgid: u32,
    killing: bool,
    pub cores: u32,
    pub memory_mb: u64,
}

/// What an executor was asked to be: its ids, its application and its share of the worker.
pub(super) struct Launch<'a> {
    pub app_id: &'a str,
    pub executor_id: &'a str,
    pub app: &'a wire::AppDescription<'a>,
    pub cores: u32,
    pub memory_mb: u64,
}

/// The worker's executors and what is pending about them.
#[derive(Default)]
pub(super) struct Supervisor {
    running: HashMap<Key, Running>,
    /// Applications that ended: their directory goes once their last executor has exited.
    finished_apps: HashSet<String>,
    /// `SIGKILL` timers of executors sent `SIGTERM`.
    kill_timers: HashMap<TimerId, Key>,
}

impl Supervisor {
    /// The executors running.
    pub fn running(&self) -> &HashMap<Key, Running> {
        &self.running
    }

    /// Starts an executor (reported LAUNCHING, then RUNNING or FAILED); a duplicate is ignored.
    pub fn launch(
        &mut self,
        config: &WorkerConfig,
        launch: &Launch<'_>,
        session: &mut Session,
        ctx: &mut Ctx<'_, WorkerEndpoint>,
    ) {
        let (app_id, executor_id) = (launch.app_id, launch.executor_id);
        let report = |state, message: String| Report {
            app: app_id.to_owned(),
            executor: executor_id.to_owned(),
            state,
            message,
            exit_code: None,
        };
        let key = (app_id.to_owned(), executor_id.to_owned());
        if self.running.contains_key(&key) {
            return;
        }
        let started = self.admit(config, launch).and_then(|()| {
            session.report(report(ProcessState::Launching, String::new()));
            let dir = config.work_dir.join(app_id).join(executor_id);
            spawn_executor(config, &dir, launch)
                .and_then(|child| watch(child, key.clone(), ctx.myself()))
                .map(|pgid| (pgid, dir))
        });
        let (pgid, dir) = match started {
            Ok(started) => started,
            Err(message) => {
                tracing::warn!(
                    "worker {}: executor {app_id}/{executor_id} not started: {message}",
                    config.id
                );
                return session.report(report(ProcessState::Failed, message));
            }
        };
        tracing::info!(
            "worker {}: started executor {app_id}/{executor_id} (pid {pgid}) in {}",
            config.id,
            dir.display()
        );
        let (cores, memory_mb) = (launch.cores, launch.memory_mb);
        let running = Running {
            pgid,
            killing: false,
            cores,
            memory_mb,
        };
        self.running.insert(key, running);
        session.report(report(ProcessState::Running, format!("pid {pgid}")));
    }

    /// Whether the worker takes this launch: ids fit for directory names, room for one more.
    fn admit(&self, config: &WorkerConfig, launch: &Launch<'_>) -> Result<(), String> {
        if !safe_component(launch.app_id) || !safe_component(launch.executor_id) {
            return Err("application or executor id unfit for a directory name".into());
        }
        if self.running.len() >= config.executors_max {
            return Err(format!(
                "{} executors running (executors_max)",
                self.running.len()
            ));
        }
        Ok(())
    }

    /// `SIGTERM` to an executor's group, `SIGKILL` after `kill_timeout`.
    pub fn kill(&mut self, key: Key, config: &WorkerConfig, ctx: &mut Ctx<'_, WorkerEndpoint>) {
        let Some(running) = self.running.get_mut(&key) else {
            return;
        };
        if running.killing {
            return;
        }
        running.killing = true;
        signal_group(running.pgid, "-TERM");
        if let Ok(timer) = ctx.timer_once(config.kill_timeout) {
            self.kill_timers.insert(timer, key);
        }
    }

    /// A timer of [`Supervisor::kill`]: `SIGKILL` if that executor still runs. Whether the
    /// timer was one.
    pub fn on_timer(&mut self, timer: TimerId) -> bool {
        let Some(key) = self.kill_timers.remove(&timer) else {
            return false;
        };
        if let Some(running) = self.running.get(&key) {
            signal_group(running.pgid, "-KILL");
        }
        true
    }

    /// `SIGKILL` to every executor (the worker stops).
    pub fn kill_all(&mut self) {
        for running in self.running.values() {
            signal_group(running.pgid, "-KILL");
        }
    }

    /// An application is over: its executors are killed, its directory removed once none runs.
    pub fn app_finished(
        &mut self,
        app_id: &str,
        config: &WorkerConfig,
        ctx: &mut Ctx<'_, WorkerEndpoint>,
    ) {
        let keys: Vec<Key> = self
            .running
            .keys()
            .filter(|(app, _)| app == app_id)
            .cloned()
            .collect();
        for key in keys {
            self.kill(key, config, ctx);
        }
        if safe_component(app_id) {
            self.finished_apps.insert(app_id.to_owned());
            self.clean_up(app_id, config);
        }
    }

    /// An executor's process ended (its exit code and the signal that ended it, each if any):
    /// reported EXITED, KILLED or FAILED with its exit code.
    pub fn on_exited(
        &mut self,
        key: Key,
        (code, signal): (Option<i32>, Option<i32>),
        config: &WorkerConfig,
        session: &mut Session,
    ) {
        let Some(running) = self.running.remove(&key) else {
            return;
        };
        let (state, message) = if code == Some(0) {
            (ProcessState::Exited, "exited normally".to_owned())
        } else if running.killing {
            (ProcessState::Killed, "killed by the worker".to_owned())
        } else if let Some(signal) = signal {
            (ProcessState::Failed, format!("killed by signal {signal}"))
        } else {
            (
                ProcessState::Failed,
                format!("exited with code {}", code.unwrap_or(-1)),
            )
        };
        let (app, executor) = key;
        tracing::info!(
            "worker {}: executor {app}/{executor} {state}: {message}",
            config.id
        );
        self.kill_timers
            .retain(|_, (a, e)| (a.as_str(), e.as_str()) != (&app, &executor));
        let finished = self.finished_apps.contains(&app);
        // A signal's death as the shell shows it (128 + the signal), so the application's
        // client can tell a crash (SIGABRT, SIGSEGV, ...) from a kill.
        let exit_code = code.or(signal.map(|signal| 128 + signal));
        session.report(Report {
            app: app.clone(),
            executor,
            state,
            message,
            exit_code,
        });
        if finished {
            self.clean_up(&app, config);
        }
    }

    /// Removes a finished application's directory once none of its executors runs.
    fn clean_up(&mut self, app: &str, config: &WorkerConfig) {
        if self.running.keys().any(|(a, _)| a == app) {
            return;
        }
        self.finished_apps.remove(app);
        let dir = config.work_dir.join(app);
        if let Err(error) = std::fs::remove_dir_all(&dir) {
            if error.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!("cannot remove {}: {error}", dir.display());
            }
        }
    }
}

/// A directory name from a peer: letters, digits, `-`, `_`, `.`; not `.` or `..`.
pub(super) fn safe_component(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name != "."
        && name != ".."
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// Starts an executor's process in `dir` (its stdout, stderr and pid files there).
fn spawn_executor(
    config: &WorkerConfig,
    dir: &Path,
    launch: &Launch<'_>,
) -> Result<std::process::Child, String> {
    let app = launch.app;
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let stdout = std::fs::File::create(dir.join("stdout"))
        .map_err(|e| format!("cannot create stdout: {e}"))?;
    let stderr = std::fs::File::create(dir.join("stderr"))
        .map_err(|e| format!("cannot create stderr: {e}"))?;
    let mut command = executor_command(config, app, launch.executor_id, launch.cores)?;
    let (passed, dropped) = application_env(app);
    if !dropped.is_empty() {
        tracing::warn!(
            "worker {}: executor {}/{}: not passing the application's environment variables \
             {dropped:?} (passed: {APP_ENV_ALLOWED:?} and names starting with {APP_ENV_PREFIX})",
            config.id,
            launch.app_id,
            launch.executor_id
        );
    }
    command
        .args(app.args.iter())
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .envs(passed)
        .env("FLINT_DRIVER_ADDR", app.driver_addr)
        .env("FLINT_APP_ID", launch.app_id)
        .env("FLINT_EXECUTOR_ID", launch.executor_id)
        .env("FLINT_WORKER_ID", &config.id)
        .env("FLINT_WORKER_PID", std::process::id().to_string())
        .env("FLINT_EXECUTOR_CORES", launch.cores.to_string())
        .env("FLINT_EXECUTOR_MEMORY_MB", launch.memory_mb.to_string())
        .process_group(0);
    // The worker hands its own secret (the cluster's) to its executors: it never travels
    // in the application's description, which the master journals.
    match &config.secret {
        Some(secret) => {
            use std::os::unix::ffi::OsStrExt;
            command.env(
                SECRET_ENV,
                std::ffi::OsStr::from_bytes(secret.expose_bytes()),
            );
        }
        None => {
            command.env_remove(SECRET_ENV);
        }
    }
    let child = command
        .spawn()
        .map_err(|e| format!("cannot start {:?}: {e}", command.get_program()))?;
    let _ = std::fs::write(dir.join("pid"), format!("{}\n", child.id()));
    Ok(child)
}

/// The application's environment variables a worker passes to its executors: what an executor
/// needs to log and tune itself. Anything else (the dynamic loader's `LD_*`, `GCONV_PATH`,
/// `LOCPATH`, interpreters' startup variables, ...) could make the executor's program run code
/// the application chose, past `--allow-command`.
pub(super) const APP_ENV_ALLOWED: &[&str] = &[
    "RUST_LOG",
    "RUST_BACKTRACE",
    "RUST_LIB_BACKTRACE",
    "FLINT_LOG_FORMAT",
    "FLINT_SPIN",
];

/// The prefix of the application's own variables, passed as they are (the worker's
/// `FLINT_APP_ID` is set after them, so it wins).
pub(super) const APP_ENV_PREFIX: &str = "FLINT_APP_";

/// An application's environment split into what is passed (name, value) and the names dropped.
fn application_env<'a>(app: &wire::AppDescription<'a>) -> (Vec<(&'a str, &'a str)>, Vec<String>) {
    let (mut passed, mut dropped) = (Vec::new(), Vec::new());
    for kv in app.env.iter() {
        let plain = kv
            .key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_');
        let allowed = APP_ENV_ALLOWED.contains(&kv.key)
            || (kv.key.starts_with(APP_ENV_PREFIX) && kv.key.len() > APP_ENV_PREFIX.len());
        if plain && allowed && kv.key != SECRET_ENV {
            passed.push((kv.key, kv.value));
        } else {
            // Names only: a value may be a credential.
            dropped.push(kv.key.chars().take(64).collect());
        }
    }
    (passed, dropped)
}

/// The program an application's executor runs: `flint executor` (no extra arguments), or
/// one of the allowed commands.
fn executor_command(
    config: &WorkerConfig,
    app: &wire::AppDescription<'_>,
    executor_id: &str,
    cores: u32,
) -> Result<Command, String> {
    if !app.command.is_empty() {
        if command_allowed(config, app.command) {
            return Ok(Command::new(app.command));
        }
        return Err(format!(
            "command {:?} is not allowed on this worker: it runs `flint executor` and \
             the programs given with --allow-command",
            app.command
        ));
    }
    if !app.args.is_empty() {
        return Err("arguments for the default executor (flint executor) are not accepted".into());
    }
    let mut command = Command::new(&config.executor_program);
    command.args([
        "executor",
        "--driver",
        app.driver_addr,
        "--id",
        executor_id,
        "--cores",
        &cores.max(1).to_string(),
    ]);
    Ok(command)
}

/// Whether an application may run `command` here: it is one of the allowed programs, as
/// given or as the same file.
fn command_allowed(config: &WorkerConfig, command: &str) -> bool {
    let wanted = Path::new(command);
    let canonical = std::fs::canonicalize(wanted).ok();
    config.allowed_commands.iter().any(|allowed| {
        allowed == wanted
            || (canonical.is_some() && std::fs::canonicalize(allowed).ok() == canonical)
    })
}

/// A thread that waits for an executor's exit and tells the endpoint; the process group's id,
/// or why there is no such thread (the child is then killed).
fn watch(
    mut child: std::process::Child,
    (app, executor): Key,
    me: EndpointRef<WorkerEndpoint>,
) -> Result<u32, String> {
    let pgid = child.id();
    let waiter = std::thread::Builder::new()
        .name(format!("flint-wait-{executor}"))
        .spawn(move || {
            let (code, signal) = match child.wait() {
                Ok(status) => (status.code(), status.signal()),
                Err(_) => (None, None),
            };
            send_retrying(&me, || WorkerMsg::Exited {
                app: app.clone(),
                executor: executor.clone(),
                code,
                signal,
            });
        });
    match waiter {
        Ok(_) => Ok(pgid),
        Err(error) => {
            signal_group(pgid, "-KILL");
            Err(format!("no thread to watch the executor: {error}"))
        }
    }
}

/// Sends a signal to a process group with the `kill` command.
fn signal_group(pgid: u32, signal: &str) {
    let result = Command::new("kill")
        .args([signal, "--", &format!("-{pgid}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if let Err(error) = result {
        tracing::warn!("kill {signal} -{pgid} failed: {error}");
    }
}

/// Kills executors a previous run of this worker left behind (it was killed and they kept
/// running: the master has declared them lost) and removes their directories. A `pid` file is
/// trusted only if that process's environment names this worker, so a reused pid is left alone.
pub(super) fn reap_stale_executors(work_dir: &Path, worker_id: &str) {
    let marker = format!("FLINT_WORKER_ID={worker_id}");
    let Ok(apps) = std::fs::read_dir(work_dir) else {
        return;
    };
    for app in apps.flatten() {
        let Ok(executors) = std::fs::read_dir(app.path()) else {
            continue;
        };
        for executor in executors.flatten() {
            // The executor could have made it anything (a FIFO, a huge file): 64 bytes of a
            // regular file at most.
            let pid_file = executor.path().join("pid");
            let Ok((text, _)) = crate::files::read_small(&pid_file, 64) else {
                continue;
            };
            let text = String::from_utf8_lossy(&text);
            let Ok(pid) = text.trim().parse::<u32>() else {
                continue;
            };
            let ours = std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|environ| {
                environ
                    .split(|b| *b == 0)
                    .any(|entry| entry == marker.as_bytes())
            });
            if ours {
                tracing::warn!(
                    "worker {worker_id}: killing executor {} (pid {pid}) left from a previous run",
                    executor.path().display()
                );
                signal_group(pid, "-KILL");
            }
        }
        if let Err(error) = std::fs::remove_dir_all(app.path()) {
            tracing::warn!("cannot remove {}: {error}", app.path().display());
        }
    }
}
