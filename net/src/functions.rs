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
    /// checksummed job can be made to take time), `fail:P`, `crash:P`.
    pub fn with_builtins() -> Self {
        let mut registry = Registry::new();
        registry.register("noop", |_, _| Ok(Bytes::new()));
        registry.register("echo", |_, payload| Ok(payload));
        registry.register("hash", |ctx, payload| {
            // `hash:MS` sleeps first, as documented above; plain `hash` does not.
            if ctx.argument().is_some() {
                let ms: u64 = parse_argument(ctx, "hash:MS")?;
                wait_unless_killed(ctx, Duration::from_millis(ms), |remaining| {
                    std::thread::sleep(remaining.min(Duration::from_millis(10)))
                })?;
            }
            Ok(Bytes::copy_from_slice(&fnv1a64(&payload).to_le_bytes()))
        });
        registry.register("sleep", |ctx, _| {
            let ms: u64 = parse_argument(ctx, "sleep:MS")?;
            wait_unless_killed(ctx, Duration::from_millis(ms), |remaining| {
                std::thread::sleep(remaining.min(Duration::from_millis(10)))
            })?;
            Ok(Bytes::new())
        });
        registry.register("spin", |ctx, _| {
            let us: u64 = parse_argument(ctx, "spin:US")?;
            wait_unless_killed(ctx, Duration::from_micros(us), |_| std::hint::spin_loop())?;
            Ok(Bytes::new())
        });
        registry.register("fail", |ctx, _| {
            let probability: f64 = parse_argument(ctx, "fail:P")?;
            if chance(ctx, 0x6661_696c) < probability {
                return Err(TaskError::new(format!(
                    "fail:{probability}: attempt {} failed on purpose",
                    ctx.attempt
                )));
            }
            Ok(Bytes::new())
        });
        registry.register("crash", |ctx, _| {
            let probability: f64 = parse_argument(ctx, "crash:P")?;
            if chance(ctx, 0x6372_6173) < probability {
                eprintln!(
                    "crash:{probability}: task {} attempt {} aborts this executor",
                    ctx.task_id, ctx.attempt
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

fn parse_argument<T: std::str::FromStr>(ctx: &TaskContext, usage: &str) -> Result<T, TaskError> {
    let text = ctx
        .argument()
        .ok_or_else(|| TaskError::new(format!("missing argument: use {usage}")))?;
    text.parse()
        .map_err(|_| TaskError::new(format!("bad argument {text:?}: use {usage}")))
}

/// Waits for `duration`, calling `step` with the time left, unless the task is killed first.
fn wait_unless_killed(
    ctx: &TaskContext,
    duration: Duration,
    step: impl Fn(Duration),
) -> Result<(), TaskError> {
    let deadline = Instant::now() + duration;
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
            TaskError::new("bad argument \"x\": use sleep:MS")
        );
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
