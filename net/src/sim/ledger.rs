//! The simulator's ledger: what the user asked for (each job as planned, its handle), what the
//! executors really did (every launch and every honest run's result), and the checks that tie
//! the two together after every step: each handle gets one outcome, a success holds exactly
//! the bytes executors' runs of those tasks produced, streamed and observed results give each
//! task once, a failure has a reason the simulation caused, and only cancelled jobs end
//! cancelled.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use flint_engine::scheduler::{Attempt, JobId, JobOutcome, TaskId};

use crate::job::{JobHandle, TaskResult};
use crate::sim::hostile::HOSTILE_REASON;
use crate::sim::runner::INJECTED_FAILURE;

/// An attempt number no task reaches (failures and speculation stay far below it).
pub const NEVER_ATTEMPT: u32 = 1_000;

/// A job as the scenario plans it.
#[derive(Clone, Debug)]
pub struct PlannedJob {
    /// Its tasks' inputs.
    pub payloads: Vec<Bytes>,
    /// `Job::keep_results`.
    pub keep_results: bool,
    /// `Job::stream_results`.
    pub stream: bool,
    /// `Job::deadline`, micros.
    pub deadline_us: Option<u64>,
    /// When the user cancels it, if at all.
    pub cancel_us: Option<u64>,
    /// When the user drops its handle, if at all (the job must be cancelled).
    pub drop_us: Option<u64>,
}

/// Results the job's observer saw, shared with the observer the driver calls.
pub type Observed = Arc<Mutex<Vec<TaskResult>>>;

/// One submitted job and what was seen of it.
#[derive(Debug)]
pub struct JobRecord {
    /// The plan.
    pub plan: PlannedJob,
    /// Its id.
    pub id: u64,
    /// The handle, until dropped.
    pub handle: Option<JobHandle>,
    observed: Observed,
    /// Each task's final result, as the observer reported it.
    results: BTreeMap<u32, Result<Bytes, String>>,
    /// Tasks whose result the handle streamed.
    streamed: BTreeSet<u32>,
    /// The outcome, once the handle gave it.
    pub outcome: Option<JobOutcome>,
    /// The user cancelled it (or dropped its handle).
    pub cancelled: bool,
    /// When it was submitted.
    submitted_us: u64,
}

impl JobRecord {
    /// Whether the job has ended (as far as anyone can tell: a dropped handle's job counts as
    /// ended once every task reported or it was cancelled).
    pub fn is_open(&self) -> bool {
        match &self.handle {
            Some(_) => self.outcome.is_none(),
            None => false,
        }
    }
}

/// Everything the checks need.
#[derive(Debug, Default)]
pub struct Ledger {
    /// Jobs in the order submitted.
    pub jobs: Vec<JobRecord>,
    by_id: BTreeMap<u64, usize>,
    /// Every attempt ever launched on an executor.
    launched: BTreeSet<Attempt>,
    /// Each honest run that finished: task -> attempt -> its result.
    runs: BTreeMap<u64, BTreeMap<u32, Bytes>>,
    /// Jobs with an injected failure.
    failed_runs: BTreeSet<u64>,
    /// Jobs that succeeded, failed, were cancelled (outcomes seen by handles).
    pub outcomes: [u64; 3],
    /// Jobs whose handles were dropped while they were open (they must end cancelled).
    pub dropped_open: u64,
}

impl Ledger {
    /// A job the driver accepted, with its handle and its observer's results; its index.
    pub fn submitted(
        &mut self,
        plan: PlannedJob,
        handle: JobHandle,
        observed: Observed,
        now_us: u64,
    ) -> usize {
        let id = handle.id();
        let index = self.jobs.len();
        self.by_id.insert(id, index);
        self.jobs.push(JobRecord {
            plan,
            id,
            handle: Some(handle),
            observed,
            results: BTreeMap::new(),
            streamed: BTreeSet::new(),
            outcome: None,
            cancelled: false,
            submitted_us: now_us,
        });
        index
    }

    /// The planned payload of `task_id`, if it belongs to a submitted job.
    pub fn payload(&self, task_id: u64) -> Option<&Bytes> {
        let task = TaskId(task_id);
        let j = *self.by_id.get(&task.job().0)?;
        self.jobs.get(j)?.plan.payloads.get(task.index() as usize)
    }

    /// An executor was told to run `(task_id, attempt)` on `payload`: a known task, its own
    /// input, an attempt never launched before.
    pub fn launch(&mut self, task_id: u64, attempt: u32, payload: &[u8]) -> Result<(), String> {
        let Some(planned) = self.payload(task_id) else {
            return Err(format!("launch of task {task_id:#x}, which no job has"));
        };
        if planned.as_ref() != payload {
            return Err(format!(
                "launch of task {task_id:#x} with another task's payload"
            ));
        }
        if !self.launched.insert(Attempt::new(TaskId(task_id), attempt)) {
            return Err(format!(
                "attempt {attempt} of task {task_id:#x} launched twice"
            ));
        }
        Ok(())
    }

    /// An honest run ended with `data` (`Ok`: finished; `Err`: failed).
    pub fn ran(&mut self, task_id: u64, attempt: u32, result: Result<Bytes, ()>) {
        match result {
            Ok(data) => {
                self.runs.entry(task_id).or_default().insert(attempt, data);
            }
            Err(()) => {
                self.failed_runs.insert(TaskId(task_id).job().0);
            }
        }
    }

    /// Submitted jobs whose outcome is still to come.
    pub fn open_jobs(&self) -> usize {
        self.jobs.iter().filter(|j| j.is_open()).count()
    }

    /// Attempts a hostile peer cannot have been given, to lie about (up to `max`, with their
    /// payloads): each launched on an honest executor, and attempt [`NEVER_ATTEMPT`] of every
    /// task of a job still open (a launch to the liar may be in flight, unseen by it, so no
    /// other attempt number is safe).
    pub fn targets(&self, max: usize) -> Vec<(u64, u32, Bytes)> {
        let launched = (self.launched.iter().rev()).filter_map(|&Attempt { task, attempt }| {
            Some((task.0, attempt, self.payload(task.0)?.clone()))
        });
        let never = (self.jobs.iter().filter(|j| j.outcome.is_none())).flat_map(|j| {
            (j.plan.payloads.iter().enumerate()).map(move |(i, p)| {
                (
                    TaskId::new(JobId(j.id), i as u32).0,
                    NEVER_ATTEMPT,
                    p.clone(),
                )
            })
        });
        launched.take(max / 2).chain(never).take(max).collect()
    }

    /// The user cancels job `j` through its handle, or drops the handle (which must cancel it).
    /// A job still open when the user cancels it (the driver hears at once) must end
    /// cancelled; one dropped while open is counted in [`Ledger::dropped_open`] (its handle is
    /// gone: the driver's own count of cancelled jobs must include it).
    pub fn cancel(&mut self, j: usize, drop_handle: bool, now_us: u64) -> Result<(), String> {
        // An outcome already there is taken first: the job was not open.
        self.check_results(j)?;
        self.check_outcome(j, now_us)?;
        let Some(job) = self.jobs.get_mut(j) else {
            return Ok(());
        };
        if job.outcome.is_some() || job.handle.is_none() {
            return Ok(());
        }
        job.cancelled = true;
        if drop_handle {
            job.handle = None;
            self.dropped_open += 1;
        } else if let Some(handle) = &job.handle {
            handle.cancel();
        }
        Ok(())
    }

    /// The per-step checks of every job (see the module docs).
    pub fn check(&mut self, now_us: u64) -> Result<(), String> {
        for j in 0..self.jobs.len() {
            self.check_results(j)?;
            self.check_outcome(j, now_us)?;
        }
        Ok(())
    }

    /// What the observer and the stream reported since the last check.
    fn check_results(&mut self, j: usize) -> Result<(), String> {
        let Some(job) = self.jobs.get_mut(j) else {
            return Ok(());
        };
        let fresh: Vec<TaskResult> =
            std::mem::take(&mut *job.observed.lock().unwrap_or_else(|p| p.into_inner()));
        let n = job.plan.payloads.len();
        for (index, result) in fresh {
            if index as usize >= n {
                return Err(format!("job {}: result for task {index} of {n}", job.id));
            }
            if let Ok(data) = &result {
                let task = TaskId::new(JobId(job.id), index).0;
                let honest = self
                    .runs
                    .get(&task)
                    .is_some_and(|runs| runs.values().any(|r| r == data));
                if !honest {
                    return Err(format!(
                        "job {}: task {index} succeeded with bytes no executor's run produced",
                        job.id
                    ));
                }
            }
            if let Err(reason) = &result {
                if reason.contains(HOSTILE_REASON) {
                    return Err(format!("job {}: task {index} failed by a lie", job.id));
                }
            }
            if job.results.insert(index, result).is_some() {
                return Err(format!("job {}: task {index} reported twice", job.id));
            }
        }
        if let Some(handle) = job.handle.as_mut() {
            while let Some((index, result)) = handle.next_result(Some(Duration::ZERO)) {
                if !job.plan.stream {
                    return Err(format!("job {}: streamed a result, not streaming", job.id));
                }
                if !job.streamed.insert(index) {
                    return Err(format!("job {}: task {index} streamed twice", job.id));
                }
                if job.results.get(&index) != Some(&result) {
                    return Err(format!(
                        "job {}: task {index} streamed other than observed",
                        job.id
                    ));
                }
            }
        }
        Ok(())
    }

    /// The outcome, if the handle has it now.
    fn check_outcome(&mut self, j: usize, now_us: u64) -> Result<(), String> {
        let Some(job) = self.jobs.get_mut(j) else {
            return Ok(());
        };
        let Some(handle) = job.handle.as_mut() else {
            return Ok(());
        };
        let mut cx = Context::from_waker(Waker::noop());
        let outcome = match Pin::new(handle).poll(&mut cx) {
            Poll::Ready(outcome) => outcome,
            Poll::Pending => return Ok(()),
        };
        if job.outcome.is_some() {
            return Err(format!("job {}: a second outcome {outcome:?}", job.id));
        }
        let failed_runs = self.failed_runs.contains(&job.id);
        judge(job, &outcome, failed_runs, now_us)?;
        self.outcomes[match outcome {
            JobOutcome::Succeeded(_) => 0,
            JobOutcome::Failed(_) => 1,
            JobOutcome::Cancelled => 2,
        }] += 1;
        job.outcome = Some(outcome);
        Ok(())
    }
}

/// Whether `outcome` is one the job may have.
fn judge(
    job: &JobRecord,
    outcome: &JobOutcome,
    failed_runs: bool,
    now_us: u64,
) -> Result<(), String> {
    let n = job.plan.payloads.len() as u32;
    let id = job.id;
    match outcome {
        JobOutcome::Succeeded(kept) => {
            let mut results = Vec::new();
            for i in 0..n {
                match job.results.get(&i) {
                    Some(Ok(data)) => results.push(data.clone()),
                    other => {
                        return Err(format!("job {id} succeeded, task {i} reported {other:?}"))
                    }
                }
            }
            if job.plan.stream && job.streamed.len() != n as usize {
                return Err(format!(
                    "job {id} succeeded having streamed {} of {n} results",
                    job.streamed.len()
                ));
            }
            let expected = if job.plan.keep_results {
                results
            } else {
                Vec::new()
            };
            if *kept != expected {
                return Err(format!(
                    "job {id} succeeded with other results than its tasks'"
                ));
            }
        }
        JobOutcome::Failed(reasons) => {
            if reasons.iter().any(|r| r.contains(HOSTILE_REASON)) {
                return Err(format!("job {id} failed by a lie: {reasons:?}"));
            }
            let deadline_passed = job
                .plan
                .deadline_us
                .is_some_and(|d| now_us >= job.submitted_us.saturating_add(d));
            let explained = failed_runs
                || deadline_passed
                || reasons
                    .iter()
                    .any(|r| r.contains(INJECTED_FAILURE) || r.contains("executor"));
            if !explained {
                return Err(format!("job {id} failed with no cause: {reasons:?}"));
            }
        }
        JobOutcome::Cancelled => {
            if !job.cancelled {
                return Err(format!("job {id} ended cancelled, never cancelled"));
            }
        }
    }
    if job.cancelled && !matches!(outcome, JobOutcome::Cancelled) {
        return Err(format!(
            "job {id} was cancelled while open, ended {outcome:?}"
        ));
    }
    Ok(())
}
