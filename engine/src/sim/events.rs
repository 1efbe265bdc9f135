//! The simulated world's events as the scheduler meets them: executors registering, dying
//! and being removed; jobs submitted and cancelled; launches arriving, attempts completing,
//! kills arriving, executors exiting.

use super::*;

impl Sim {
    /// An executor registers: accepted, or refused (an excluded host), as expected. Returns false if the event is ignored (then nothing follows it).
    pub(super) fn on_register(&mut self, id: ExecutorId) -> Result<bool, SimError> {
        let now = self.now_us;
        let Some(e) = self.execs.get(&id) else {
            return Ok(false);
        };
        if e.deleted {
            return Ok(false);
        }
        let info = e.info.clone();
        match self.sched.handle_register(info, now) {
            Ok(()) => {
                if let Some(e) = self.execs.get_mut(&id) {
                    e.alive = true;
                    e.registered = true;
                }
                self.churn_update(id, ExecutorState::Running);
            }
            Err(Refusal::HostExcluded { .. }) => {
                self.report.refusals += 1;
                if let Some(e) = self.execs.get_mut(&id) {
                    e.retired = true;
                }
                // A refused executor exits (code 3).
                self.churn_update(
                    id,
                    ExecutorState::Failed {
                        code: 3,
                        caused_by_app: false,
                    },
                );
            }
            Err(r) => return self.fail(format!("unexpected refusal of {id:?}: {r}")),
        }
        Ok(true)
    }

    /// A registered executor registers again: refused as a duplicate. Returns false if the event is ignored (then nothing follows it).
    pub(super) fn on_register_duplicate(&mut self, id: ExecutorId) -> Result<bool, SimError> {
        let now = self.now_us;
        let Some(e) = self.execs.get(&id) else {
            return Ok(false);
        };
        if !e.registered {
            return Ok(false);
        }
        let info = e.info.clone();
        match self.sched.handle_register(info, now) {
            Err(Refusal::DuplicateId(d)) if d == id => self.report.refusals += 1,
            other => return self.fail(format!("duplicate registration of {id:?}: {other:?}")),
        }
        Ok(true)
    }

    /// A live executor dies: its removal reaches the scheduler later (sometimes first as a lost connection, the exit reason after).
    pub(super) fn on_die(&mut self, id: ExecutorId, reason: RemovalReason) {
        let now = self.now_us;
        if let Some(e) = self.execs.get_mut(&id) {
            if e.alive {
                e.alive = false;
                e.running.clear();
                self.report.executors_lost += 1;
                let t = now + self.rng.range(0, 50_000);
                if reason.caused_by_app() && self.rng.chance(0.5) {
                    // The connection closes first (lost, no word on whose fault); the
                    // cluster manager's exit reason comes later and is charged then.
                    self.taint_held(id);
                    self.at(t, Ev::Remove(id, RemovalReason::Lost("closed".into())));
                    let late = t + self.rng.range(1, 30_000);
                    self.at(late, Ev::Remove(id, reason));
                } else {
                    self.at(t, Ev::Remove(id, reason));
                }
            }
        }
    }

    /// An executor is removed from the scheduler, noting which jobs a late exit reason is charged to.
    pub(super) fn on_remove(
        &mut self,
        id: ExecutorId,
        reason: RemovalReason,
    ) -> Result<(), SimError> {
        let now = self.now_us;
        if reason.caused_by_app() {
            self.taint_held(id);
            // A late reason is charged to what the executor held when it was lost.
            for job in self.lost_held.remove(&id).unwrap_or_default() {
                self.tainted.insert(job);
            }
        } else if matches!(reason, RemovalReason::Lost(_)) {
            if let Some(e) = self.execs.get(&id) {
                let jobs = e.held.keys().map(|key| key.task.job()).collect();
                self.lost_held.insert(id, jobs);
            }
        }
        let registered = self.execs.get(&id).is_some_and(|e| e.registered);
        let removed = self.sched.handle_remove(id, reason, now);
        if removed != registered {
            return self.fail(format!(
                "remove_executor({id:?}) returned {removed}, registered = {registered}"
            ));
        }
        if let Some(e) = self.execs.get_mut(&id) {
            e.registered = false;
            e.retired = true;
            e.held.clear();
        }
        Ok(())
    }

    /// Planned job `j` is submitted: accepted, or refused by backpressure. Returns false if the event is ignored (then nothing follows it).
    pub(super) fn on_submit(&mut self, j: usize) -> Result<bool, SimError> {
        let now = self.now_us;
        let Some(job) = self.jobs.get(j) else {
            return Ok(false);
        };
        // The planned job's index as its token, which each of its events must carry back.
        let spec = JobSpec {
            token: JobToken(j as u32),
            ..job.spec.clone()
        };
        let n = spec.tasks.len() as u64;
        match self.sched.handle_submit(spec, now) {
            Ok(id) => {
                self.job_index.insert(id, j);
                if let Some(job) = self.jobs.get_mut(j) {
                    job.id = Some(id);
                }
                self.report.jobs += 1;
                self.report.tasks += n;
            }
            Err(crate::scheduler::SubmitError::TooManyPending { .. }) => {
                self.report.jobs_refused += 1;
            }
            Err(e) => return self.fail(format!("unexpected submit error: {e}")),
        }
        Ok(true)
    }

    /// Planned job `j` is cancelled: accepted exactly when the job is open. Returns false if the event is ignored (then nothing follows it).
    pub(super) fn on_cancel(&mut self, j: usize) -> Result<bool, SimError> {
        let now = self.now_us;
        let Some(id) = self.jobs.get(j).and_then(|job| job.id) else {
            return Ok(false);
        };
        let open = self.jobs.get(j).is_some_and(|job| job.outcome.is_none());
        let accepted = self.sched.handle_cancel(id, now);
        if accepted != open {
            return self.fail(format!(
                "cancel_job({id:?}) returned {accepted} but the job is open: {open}"
            ));
        }
        if let Some(job) = self.jobs.get_mut(j) {
            job.cancelled |= accepted;
        }
        Ok(true)
    }

    /// Task `i` of planned job `j` is killed: accepted exactly when the task is open. Returns false if the event is ignored (then nothing follows it).
    pub(super) fn on_kill_task(&mut self, j: usize, i: u32) -> Result<bool, SimError> {
        let now = self.now_us;
        let Some(id) = self.jobs.get(j).and_then(|job| job.id) else {
            return Ok(false);
        };
        let task = TaskId::new(id, i);
        let ended = self.jobs.get(j).is_some_and(|job| job.outcome.is_some());
        let open = !ended && !self.results.contains_key(&task);
        let killed = self.sched.handle_kill(task, "user request", now);
        if killed != open {
            return self.fail(format!(
                "kill_task({task}) returned {killed} but task open = {open}"
            ));
        }
        Ok(true)
    }

    /// A launch reaches executor `id`: it runs (within its cores) and completes later. Returns false if the event is ignored (then nothing follows it).
    pub(super) fn on_arrive(
        &mut self,
        id: ExecutorId,
        launch: TaskLaunch,
    ) -> Result<bool, SimError> {
        let now = self.now_us;
        let slowness = match self.execs.get(&id) {
            Some(e) if e.alive => e.slowness,
            _ => return Ok(false),
        };
        let run = self.rng.range(1_000, 20_000) * slowness;
        let key = Attempt::new(launch.task, launch.attempt);
        if let Some(e) = self.execs.get_mut(&id) {
            e.running.insert(key, launch.cores);
            let used: u32 = e.running.values().sum();
            if used > e.info.cores {
                let msg = format!("executor {id:?} runs {used} cores of {}", e.info.cores);
                return self.fail(msg);
            }
        }
        self.at(now + run, Ev::Complete(id, key));
        if self.rng.chance(0.3) {
            let t = now + self.net_delay();
            self.send(t, id, key, TaskState::Running, Bytes::new());
        }
        Ok(true)
    }

    /// An attempt running on executor `id` ends: failed (injected), killed, lost or finished, reported (sometimes twice). Returns false if the event is ignored (then nothing follows it).
    pub(super) fn on_complete(&mut self, id: ExecutorId, key: Attempt) -> bool {
        let now = self.now_us;
        let Some(e) = self.execs.get_mut(&id) else {
            return false;
        };
        if !e.alive || e.running.remove(&key).is_none() {
            return false;
        }
        let t = now + self.net_delay();
        let roll = self.rng.next_u64() % 1000;
        let (state, data) = if self.rng.chance(self.failure_prob) {
            self.report.failures_injected += 1;
            (TaskState::Failed, Bytes::from_static(b"injected failure"))
        } else if roll < 20 {
            // The executor kills the attempt on its own (preempted): never counted.
            (TaskState::Killed, Bytes::from_static(b"preempted"))
        } else if roll < 23 {
            (TaskState::Lost, Bytes::new())
        } else {
            self.finished_by_exec.insert(key.task);
            (TaskState::Finished, expected_result(key.task))
        };
        self.send(t, id, key, state, data.clone());
        if self.rng.chance(0.05) {
            let t2 = t + self.net_delay();
            self.send(t2, id, key, state, data);
        }
        true
    }

    /// A kill reaches executor `id`: a running attempt is reported killed. Returns false if the event is ignored (then nothing follows it).
    pub(super) fn on_kill_arrive(&mut self, id: ExecutorId, key: Attempt) -> bool {
        let now = self.now_us;
        let Some(e) = self.execs.get_mut(&id) else {
            return false;
        };
        if e.alive && e.running.remove(&key).is_some() {
            let t = now + self.net_delay();
            self.send(t, id, key, TaskState::Killed, Bytes::new());
        }
        true
    }

    /// An allocator-created executor crashes: the snapshot store hears of its exit.
    pub(super) fn on_exit(&mut self, id: ExecutorId) {
        let crashed = match self.execs.get_mut(&id) {
            Some(e) if e.alive && !e.deleted => {
                e.alive = false;
                e.running.clear();
                true
            }
            _ => false,
        };
        if crashed {
            self.report.executors_lost += 1;
            let caused_by_app = self.rng.chance(0.5);
            self.churn_update(
                id,
                ExecutorState::Failed {
                    code: 137,
                    caused_by_app,
                },
            );
        }
    }
}
