//! Task functions: what a task runs. An executor (or local mode) holds a [`Registry`] of
//! functions by name; the driver submits tasks by name with a payload.
//!
//! A name may carry an argument after a colon (`sleep:5`): the registry looks up the whole name
//! first, then the part before the colon, and the function reads the rest with
//! [`TaskContext::argument`]. [`Registry::with_builtins`] has the functions the `flint` binary
//! ships for demos, benchmarks and tests.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

/// Why a task failed; the text goes back to the driver.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TaskError(pub String);

impl TaskError {
    /// An error with this message.
    pub fn new(message: impl Into<String>) -> Self {
        TaskError(message.into())
    }
}

/// What a running task knows about itself.
#[derive(Debug, Clone)]
pub struct TaskContext {
    /// The task's id.
    pub task_id: u64,
    /// Which attempt this is, from 0.
    pub attempt: u32,
    argument: Option<Arc<str>>,
    killed: Arc<AtomicBool>,
}

impl TaskContext {
    /// A context for one attempt; `argument` is what followed the colon in the function name.
    pub fn new(task_id: u64, attempt: u32, argument: Option<Arc<str>>) -> Self {
        TaskContext {
            task_id,
            attempt,
            argument,
            killed: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The text after the colon in the function's name (`"5"` in `sleep:5`), if any.
    pub fn argument(&self) -> Option<&str> {
        self.argument.as_deref()
    }

    /// True once the driver asked to kill this attempt. Long functions should check it.
    pub fn is_killed(&self) -> bool {
        self.killed.load(Ordering::Relaxed)
    }

    /// Asks the task to stop (the executor calls this on `KillTask`).
    pub fn kill(&self) {
        self.killed.store(true, Ordering::Relaxed);
    }
}

/// A task function.
pub type TaskFn = Arc<dyn Fn(&TaskContext, Bytes) -> Result<Bytes, TaskError> + Send + Sync>;

/// A resolved function name: the function and its argument.
#[derive(Clone)]
pub struct Resolved {
    /// The function.
    pub function: TaskFn,
    /// The argument after the colon, if any.
    pub argument: Option<Arc<str>>,
}

impl fmt::Debug for Resolved {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Resolved")
            .field("argument", &self.argument)
            .finish_non_exhaustive()
    }
}

/// Functions by name.
#[derive(Clone, Default)]
pub struct Registry {
    functions: HashMap<String, TaskFn>,
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut names: Vec<&String> = self.functions.keys().collect();
        names.sort();
        f.debug_struct("Registry")
            .field("functions", &names)
            .finish()
    }
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Registry::default()
    }

    /// A registry with the built-in functions: `noop`, `sleep:MS`, `spin:US`, `echo`, `hash`
    /// (FNV-1a 64 of the payload as 8 bytes LE; `hash:MS` first sleeps MS milliseconds, so a
    /// checksummed job can be made to take time), `gate:PATH` (waits until the file at the
    /// absolute `PATH` exists, then returns what `hash` returns: a test holds a job running
    /// while it looks at it and releases it by creating the file), `fail:P`, `crash:P`.
    pub fn with_builtins() -> Self {
        let mut registry = Registry::new();
        registry.register("noop", |_, _| Ok(Bytes::new()));
        registry.register("echo", |_, payload| Ok(payload));
        registry.register("hash", |ctx, payload| {
            // `hash:MS` sleeps first, as documented above; plain `hash` does not.
            if ctx.argument().is_some() {
                let wait = wait_argument(ctx.argument(), "hash:MS", 1000)?;
                wait_unless_killed(ctx, wait, |remaining| {
                    std::thread::sleep(remaining.min(Duration::from_millis(10)))
                })?;
            }
            Ok(Bytes::copy_from_slice(&fnv1a64(&payload).to_le_bytes()))
        });
        registry.register("sleep", |ctx, _| {
            let wait = wait_argument(ctx.argument(), "sleep:MS", 1000)?;
            wait_unless_killed(ctx, wait, |remaining| {
                std::thread::sleep(remaining.min(Duration::from_millis(10)))
            })?;
            Ok(Bytes::new())
        });
        registry.register("gate", |ctx, payload| {
            let gate = gate_argument(ctx.argument())?;
            wait_for_gate(ctx, gate)?;
            Ok(Bytes::copy_from_slice(&fnv1a64(&payload).to_le_bytes()))
        });
        registry.register("spin", |ctx, _| {
            let spin = wait_argument(ctx.argument(), "spin:US", 1)?;
            wait_unless_killed(ctx, spin, |_| std::hint::spin_loop())?;
            Ok(Bytes::new())
        });
        registry.register("fail", |ctx, _| {
            let probability = probability_argument(ctx.argument(), "fail:P")?;
            if chance(ctx, 0x6661_696c) < probability {
                return Err(TaskError::new(format!(
                    "fail:{probability}: attempt {} failed on purpose",
                    ctx.attempt
                )));
            }
            Ok(Bytes::new())
        });
        registry.register("crash", |ctx, _| {
            let probability = probability_argument(ctx.argument(), "crash:P")?;
            if chance(ctx, 0x6372_6173) < probability {
                tracing::error!(
                    task_id = ctx.task_id,
                    attempt = ctx.attempt,
                    "crash:{probability}: this task aborts its executor"
                );
                std::process::abort();
            }
            Ok(Bytes::new())
        });
        registry
    }

    /// Registers `function` under `name` (a name without a colon; the part after a colon in a
    /// submitted name is the argument). A later registration replaces an earlier one.
    pub fn register(
        &mut self,
        name: &str,
        function: impl Fn(&TaskContext, Bytes) -> Result<Bytes, TaskError> + Send + Sync + 'static,
    ) {
        self.functions.insert(name.to_owned(), Arc::new(function));
    }

    /// Finds the function for a submitted name: the whole name, else the part before the colon
    /// with the rest as its argument.
    pub fn resolve(&self, name: &str) -> Result<Resolved, TaskError> {
        if let Some(function) = self.functions.get(name) {
            return Ok(Resolved {
                function: function.clone(),
                argument: None,
            });
        }
        if let Some((base, argument)) = name.split_once(':') {
            if let Some(function) = self.functions.get(base) {
                return Ok(Resolved {
                    function: function.clone(),
                    argument: Some(argument.into()),
                });
            }
        }
        Err(TaskError::new(format!("unknown function {name:?}")))
    }
}

/// FNV-1a, 64-bit: the `hash` built-in.
pub fn fnv1a64(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The longest a built-in waits (`hash:MS`, `sleep:MS`) or spins (`spin:US`): one hour.
pub const BUILTIN_WAIT_MAX: Duration = Duration::from_secs(3600);

/// Checks a built-in's argument the way the built-in parses it (`fail:nan`, `sleep:-1` and
/// `sleep:99999999999` are refused), so a command line can refuse it before anything runs.
/// Other names pass: only the executors know their functions.
pub fn check_builtin(name: &str) -> Result<(), TaskError> {
    let (base, argument) = match name.split_once(':') {
        Some((base, argument)) => (base, Some(argument)),
        None => (name, None),
    };
    match base {
        "hash" if argument.is_some() => wait_argument(argument, "hash:MS", 1000).map(drop),
        "sleep" => wait_argument(argument, "sleep:MS", 1000).map(drop),
        "spin" => wait_argument(argument, "spin:US", 1).map(drop),
        "gate" => gate_argument(argument).map(drop),
        "fail" => probability_argument(argument, "fail:P").map(drop),
        "crash" => probability_argument(argument, "crash:P").map(drop),
        _ => Ok(()),
    }
}

/// A whole number of `unit_us` microseconds, at most [`BUILTIN_WAIT_MAX`].
fn wait_argument(text: Option<&str>, usage: &str, unit_us: u64) -> Result<Duration, TaskError> {
    let text = text.ok_or_else(|| TaskError::new(format!("missing argument: use {usage}")))?;
    let max = BUILTIN_WAIT_MAX.as_micros() as u64 / unit_us;
    match text.parse::<u64>() {
        Ok(n) if n <= max => Ok(Duration::from_micros(n * unit_us)),
        _ => Err(TaskError::new(format!(
            "bad argument {text:?}: use {usage} with a whole number from 0 to {max}"
        ))),
    }
}

/// The longest path `gate:PATH` takes.
const GATE_PATH_MAX: usize = 4096;
/// How often a waiting `gate:PATH` looks for its file.
const GATE_CHECK_EVERY: Duration = Duration::from_millis(2);

/// `gate:PATH`'s path: absolute, at most [`GATE_PATH_MAX`] bytes.
fn gate_argument(text: Option<&str>) -> Result<&std::path::Path, TaskError> {
    let usage = "use gate:PATH with an absolute path";
    let text = text.ok_or_else(|| TaskError::new(format!("missing argument: {usage}")))?;
    let path = std::path::Path::new(text);
    if !path.is_absolute() || text.len() > GATE_PATH_MAX {
        return Err(TaskError::new(format!(
            "bad argument {text:?}: {usage} of at most {GATE_PATH_MAX} bytes"
        )));
    }
    Ok(path)
}

/// Waits until `gate` exists, at most [`BUILTIN_WAIT_MAX`]; a killed attempt or a gate that
/// stays shut that long fails.
fn wait_for_gate(ctx: &TaskContext, gate: &std::path::Path) -> Result<(), TaskError> {
    let deadline = crate::runtime::deadline_after(BUILTIN_WAIT_MAX);
    while !gate.exists() {
        if ctx.is_killed() {
            return Err(TaskError::new("killed"));
        }
        if Instant::now() >= deadline {
            return Err(TaskError::new(format!(
                "gate {} stayed shut for {} s",
                gate.display(),
                BUILTIN_WAIT_MAX.as_secs()
            )));
        }
        std::thread::sleep(GATE_CHECK_EVERY);
    }
    Ok(())
}

/// A probability: a number from 0 to 1.
fn probability_argument(text: Option<&str>, usage: &str) -> Result<f64, TaskError> {
    let text = text.ok_or_else(|| TaskError::new(format!("missing argument: use {usage}")))?;
    match text.parse::<f64>() {
        Ok(p) if (0.0..=1.0).contains(&p) => Ok(p),
        _ => Err(TaskError::new(format!(
            "bad argument {text:?}: use {usage} with a probability from 0 to 1"
        ))),
    }
}

/// Waits for `duration`, calling `step` with the time left, unless the task is killed first.
fn wait_unless_killed(
    ctx: &TaskContext,
    duration: Duration,
    step: impl Fn(Duration),
) -> Result<(), TaskError> {
    let deadline = crate::runtime::deadline_after(duration);
    loop {
        if ctx.is_killed() {
            return Err(TaskError::new("killed"));
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(());
        }
        step(deadline - now);
    }
}

/// A number in [0, 1) fixed by the task, the attempt and `salt`: the dice of `fail:P` and
/// `crash:P`, the same on every machine, different on every retry.
fn chance(ctx: &TaskContext, salt: u64) -> f64 {
    let mut z =
        ctx.task_id.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (u64::from(ctx.attempt) << 32) ^ salt;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(registry: &Registry, name: &str, payload: &[u8]) -> Result<Bytes, TaskError> {
        let resolved = registry.resolve(name)?;
        let ctx = TaskContext::new(7, 0, resolved.argument.clone());
        (resolved.function)(&ctx, Bytes::copy_from_slice(payload))
    }

    #[test]
    fn builtins_do_what_their_names_say() {
        let registry = Registry::with_builtins();
        assert_eq!(run(&registry, "noop", b"x"), Ok(Bytes::new()));
        assert_eq!(
            run(&registry, "echo", b"abc"),
            Ok(Bytes::from_static(b"abc"))
        );
        // FNV-1a 64 of "a" is 0xaf63dc4c8601ec8c (the published test vector).
        assert_eq!(
            run(&registry, "hash", b"a"),
            Ok(Bytes::copy_from_slice(
                &0xaf63_dc4c_8601_ec8cu64.to_le_bytes()
            ))
        );
        assert_eq!(
            run(&registry, "fail:1", b""),
            Err(TaskError::new("fail:1: attempt 0 failed on purpose"))
        );
        assert_eq!(run(&registry, "fail:0", b""), Ok(Bytes::new()));
        let start = Instant::now();
        assert_eq!(run(&registry, "sleep:20", b""), Ok(Bytes::new()));
        assert!(start.elapsed() >= Duration::from_millis(20));
        let start = Instant::now();
        assert_eq!(run(&registry, "spin:2000", b""), Ok(Bytes::new()));
        assert!(start.elapsed() >= Duration::from_micros(2000));
    }

    #[test]
    fn unknown_names_and_bad_arguments_are_task_errors() {
        let registry = Registry::with_builtins();
        assert_eq!(
            run(&registry, "nope", b"").unwrap_err(),
            TaskError::new("unknown function \"nope\"")
        );
        assert_eq!(
            run(&registry, "sleep:x", b"").unwrap_err(),
            TaskError::new(
                "bad argument \"x\": use sleep:MS with a whole number from 0 to 3600000"
            )
        );
        for bad in ["fail:nan", "crash:2", "sleep:3600001", "spin:-1"] {
            assert!(run(&registry, bad, b"").is_err(), "{bad}");
            assert!(check_builtin(bad).is_err(), "{bad}");
        }
        for good in [
            "fail:0.5",
            "sleep:0",
            "hash",
            "hash:3",
            "echo",
            "mine:anything",
        ] {
            assert!(check_builtin(good).is_ok(), "{good}");
        }
        assert_eq!(
            run(&registry, "sleep", b"").unwrap_err(),
            TaskError::new("missing argument: use sleep:MS")
        );
    }

    #[test]
    fn a_killed_sleep_stops_early() {
        let registry = Registry::with_builtins();
        let resolved = registry.resolve("sleep:60000").expect("resolves");
        let ctx = TaskContext::new(1, 0, resolved.argument.clone());
        ctx.kill();
        assert_eq!(
            (resolved.function)(&ctx, Bytes::new()),
            Err(TaskError::new("killed"))
        );
    }

    #[test]
    fn a_gate_holds_its_task_until_the_file_exists_and_a_killed_one_stops() {
        let registry = Registry::with_builtins();
        let dir = std::env::temp_dir().join(format!("flint-gate-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch dir");
        let gate = dir.join("open");
        let _ = std::fs::remove_file(&gate);
        let name = format!("gate:{}", gate.display());
        assert!(check_builtin(&name).is_ok());
        let resolved = registry.resolve(&name).expect("resolves");
        let ctx = TaskContext::new(1, 0, resolved.argument.clone());
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let waiter = {
            let (ctx, function) = (ctx.clone(), resolved.function.clone());
            std::thread::spawn(move || done_tx.send(function(&ctx, Bytes::from_static(b"abc"))))
        };
        // Shut: still waiting after many checks.
        let shut = done_rx.recv_timeout(GATE_CHECK_EVERY * 25);
        assert!(shut.is_err(), "a shut gate let its task end: {shut:?}");
        std::fs::write(&gate, b"").expect("open the gate");
        let result = done_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("released");
        assert_eq!(
            result,
            Ok(Bytes::copy_from_slice(&fnv1a64(b"abc").to_le_bytes()))
        );
        waiter.join().expect("joins").expect("sent");

        std::fs::remove_file(&gate).expect("shut the gate");
        let killed = TaskContext::new(2, 0, resolved.argument.clone());
        killed.kill();
        assert_eq!(
            (resolved.function)(&killed, Bytes::new()),
            Err(TaskError::new("killed"))
        );
        for bad in ["gate", "gate:", "gate:relative/path"] {
            assert!(check_builtin(bad).is_err(), "{bad}");
            assert!(run(&registry, bad, b"").is_err(), "{bad}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn fail_probability_is_about_right_and_differs_per_attempt() {
        let failures = (0..10_000u64)
            .filter(|id| chance(&TaskContext::new(*id, 0, None), 1) < 0.25)
            .count();
        assert!(
            (2_000..3_000).contains(&failures),
            "{failures} of 10000 at p=0.25"
        );
        let first = TaskContext::new(3, 0, None);
        let second = TaskContext::new(3, 1, None);
        assert_ne!(chance(&first, 1), chance(&second, 1));
    }

    #[test]
    fn hash_with_an_argument_sleeps_first_and_returns_the_same_hash() {
        let registry = Registry::with_builtins();
        let start = Instant::now();
        assert_eq!(
            run(&registry, "hash:20", b"a"),
            run(&registry, "hash", b"a")
        );
        assert!(start.elapsed() >= Duration::from_millis(20));
    }
}
