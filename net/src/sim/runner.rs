//! The fake task runner behind each simulated executor: a launched attempt ends after a seeded
//! run time with a result derived from what it was given ([`result_bytes`]), or fails now and
//! then; a kill ends it killed at once. Sans-IO: [`FakeRunner::launch`] and
//! [`FakeRunner::kill`] are inputs, [`FakeRunner::poll_timeout`] and
//! [`FakeRunner::poll_completion`] the outputs, as [`crate::runner::TaskRunner`] would give them.

use std::collections::BTreeMap;

use bytes::Bytes;
use flint_engine::sim::Rng;

use crate::wire::TaskState;
use flint_engine::runner::TaskReport;
use flint_engine::scheduler::Attempt;

/// What every honest run of `(task_id, attempt)` on `payload` returns: the ids then the
/// payload, so a result names the run that made it and the input it was given.
pub fn result_bytes(task_id: u64, attempt: u32, payload: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(12 + payload.len());
    out.extend_from_slice(&task_id.to_le_bytes());
    out.extend_from_slice(&attempt.to_le_bytes());
    out.extend_from_slice(payload);
    Bytes::from(out)
}

/// The text of an injected failure.
pub const INJECTED_FAILURE: &str = "injected failure";

/// One attempt running.
#[derive(Debug)]
struct Run {
    due_us: u64,
    state: TaskState,
    data: Bytes,
}

/// The attempts one executor runs.
#[derive(Debug, Default)]
pub struct FakeRunner {
    running: BTreeMap<Attempt, Run>,
    /// Chance that an attempt fails.
    failure_prob: f64,
    /// Run time multiplier (a straggler).
    slowness: u64,
}

impl FakeRunner {
    /// A runner whose attempts fail with `failure_prob`, `slowness` times slower than usual.
    pub fn new(failure_prob: f64, slowness: u64) -> FakeRunner {
        FakeRunner {
            running: BTreeMap::new(),
            failure_prob,
            slowness: slowness.max(1),
        }
    }

    /// Starts an attempt at `now_us`; false if that attempt already runs here.
    pub fn launch(&mut self, rng: &mut Rng, now_us: u64, key: Attempt, payload: &[u8]) -> bool {
        if self.running.contains_key(&key) {
            return false;
        }
        let run_us = if rng.chance(0.1) {
            rng.range(0, 20)
        } else {
            rng.range(100, 20_000)
        } * self.slowness;
        let (state, data) = if rng.chance(self.failure_prob) {
            (
                TaskState::Failed,
                Bytes::from_static(INJECTED_FAILURE.as_bytes()),
            )
        } else {
            (
                TaskState::Finished,
                result_bytes(key.task.0, key.attempt, payload),
            )
        };
        self.running.insert(
            key,
            Run {
                due_us: now_us + run_us,
                state,
                data,
            },
        );
        true
    }

    /// Kills an attempt: its completion (killed) is due at once. False if it does not run here.
    pub fn kill(&mut self, now_us: u64, key: Attempt) -> bool {
        match self.running.get_mut(&key) {
            Some(run) => {
                run.due_us = now_us;
                run.state = TaskState::Killed;
                run.data = Bytes::from_static(b"killed by the driver");
                true
            }
            None => false,
        }
    }

    /// The attempts running here.
    pub fn attempts(&self) -> impl Iterator<Item = Attempt> + '_ {
        self.running.keys().copied()
    }

    /// When the next attempt ends.
    pub fn poll_timeout(&self) -> Option<u64> {
        self.running.values().map(|r| r.due_us).min()
    }

    /// The next attempt that ended by `now_us`.
    pub fn poll_completion(&mut self, now_us: u64) -> Option<TaskReport> {
        let (&key, _) = self
            .running
            .iter()
            .filter(|(_, r)| r.due_us <= now_us)
            .min_by_key(|(_, r)| r.due_us)?;
        let run = self.running.remove(&key)?;
        Some(TaskReport {
            task: key.task,
            attempt: key.attempt,
            state: run.state,
            data: run.data,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flint_engine::scheduler::TaskId;

    #[test]
    fn runs_end_with_their_results_and_kills_end_them_killed() {
        let mut rng = Rng::new(3);
        let mut runner = FakeRunner::new(0.0, 1);
        let at = |task, attempt| Attempt::new(TaskId(task), attempt);
        assert!(runner.launch(&mut rng, 0, at(7, 0), b"in"));
        assert!(
            !runner.launch(&mut rng, 0, at(7, 0), b"in"),
            "one run per attempt"
        );
        assert!(runner.launch(&mut rng, 0, at(8, 1), b"x"));
        assert!(runner.kill(5, at(8, 1)));
        let killed = runner.poll_completion(5).map(|c| (c.task.0, c.state));
        assert_eq!(killed, Some((8, TaskState::Killed)));
        let due = runner.poll_timeout().unwrap_or(0);
        let done = runner.poll_completion(due).map(|c| (c.state, c.data));
        assert_eq!(done, Some((TaskState::Finished, result_bytes(7, 0, b"in"))));
        assert_eq!(runner.poll_timeout(), None);
        assert!(!runner.kill(9, at(7, 0)));
    }
}
