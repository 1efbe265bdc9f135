//! What the simulator checks: each job's outcome against what its tasks did (results,
//! failures, cancels), the scheduler's invariants after every step, and the run's end.

use super::*;

impl Sim {
    /// A job reported succeeded with results `r`: all its tasks did (`all_ok`, their
    /// `results`), the results kept are those and within its bound, and it was neither
    /// cancelled nor oversized.
    pub(super) fn check_succeeded(
        &self,
        job: JobId,
        pj: &PlannedJob,
        r: &[Bytes],
        all_ok: bool,
        results: Vec<Bytes>,
    ) -> Result<(), SimError> {
        let kept = if pj.spec.keep_results {
            results
        } else {
            Vec::new()
        };
        if !all_ok || *r != kept {
            return self.fail(format!("{job:?} succeeded but not all tasks did"));
        }
        let kept_bytes: usize = kept.iter().map(Bytes::len).sum();
        if pj
            .spec
            .result_bytes_max
            .is_some_and(|max| kept_bytes as u64 > max)
        {
            return self.fail(format!(
                "{job:?} kept {kept_bytes} result bytes, over its bound"
            ));
        }
        if pj.cancelled || pj.oversized {
            return self.fail(format!("{job:?} succeeded though cancelled or oversized"));
        }
        Ok(())
    }

    /// A job reported failed for `reasons`: some task failed (not `all_ok`), it was not
    /// cancelled, and a reason explains it.
    pub(super) fn check_failed(
        &self,
        job: JobId,
        pj: &PlannedJob,
        reasons: &[String],
        all_ok: bool,
    ) -> Result<(), SimError> {
        if all_ok || reasons.is_empty() {
            return self.fail(format!("{job:?} failed with all tasks ok: {reasons:?}"));
        }
        if pj.cancelled {
            return self.fail(format!("{job:?} was cancelled but reported failed"));
        }
        if pj.oversized && !reasons.iter().any(|r| r.contains("payload_max_bytes")) {
            return self.fail(format!("{job:?} oversized, reasons: {reasons:?}"));
        }
        // A job fails only for a reason: a counted failure (a FAILED report or an
        // exit the app caused, which taint the job), a kill by the user, a limit, or a
        // task nothing can run. Kills by executors and losses never count.
        let explained = self.tainted.contains(&job)
            || pj.oversized
            || reasons.iter().any(|r| {
                [
                    "killed:",
                    "result_bytes_max",
                    "no executor could run",
                    "cannot run anywhere",
                ]
                .iter()
                .any(|why| r.contains(why))
            });
        if !explained {
            return self.fail(format!(
                "{job:?} failed with no counted failure, kill or limit: {reasons:?}"
            ));
        }
        Ok(())
    }

    /// The per-step invariants that look at the whole state.
    pub(super) fn check(&mut self) -> Result<(), SimError> {
        let now = self.now_us;
        let mut idle = Vec::new();
        for (id, e) in &self.execs {
            let view = self.sched.executor_cores(*id);
            if !e.registered {
                if view.is_some() {
                    return self.fail(format!("{id:?} removed but the scheduler still has it"));
                }
                continue;
            }
            let held: u32 = e.held.values().sum();
            let expected = Some((e.info.cores, e.info.cores - held.min(e.info.cores)));
            if view != expected {
                return self.fail(format!(
                    "{id:?}: scheduler says (cores, free) = {view:?}, expected {expected:?}"
                ));
            }
            // Slots it may be given now: free within its slow-start window, none while stalled.
            let free = self.sched.executor_usable(*id).unwrap_or(0);
            if free >= TASK_CORES_MAX && !self.sched.is_excluded(now, *id, None) {
                for job in self.jobs.iter().filter_map(|j| j.id) {
                    if self.tainted.contains(&job) {
                        continue;
                    }
                    if self.sched.job_pending_tasks(job).is_some_and(|p| p > 0)
                        && !self.sched.is_excluded(now, *id, Some(job))
                    {
                        idle.push((*id, job));
                    }
                }
            }
        }
        self.idle_since_us.retain(|id, _| idle.contains(id));
        for (id, job) in idle {
            let since = *self.idle_since_us.entry((id, job)).or_insert(now);
            if now - since > self.idle_limit_us {
                return self.fail(format!(
                    "{id:?} idle for {} us while {job:?} has runnable tasks (limit {} us)",
                    now - since,
                    self.idle_limit_us
                ));
            }
        }
        Ok(())
    }

    /// End-of-run checks: everything accepted was reported, nothing is left inside.
    pub(super) fn finish(&mut self) -> Result<(), SimError> {
        for pj in &self.jobs {
            if let Some(id) = pj.id {
                if pj.outcome.is_none() {
                    return self.fail(format!("{id:?} never got an outcome"));
                }
            }
        }
        if self.sched.unfinished_tasks() != 0 || self.sched.active_jobs() != 0 {
            return self.fail(format!(
                "run ended with {} unfinished tasks and {} active jobs inside the scheduler",
                self.sched.unfinished_tasks(),
                self.sched.active_jobs()
            ));
        }
        Ok(())
    }
}
