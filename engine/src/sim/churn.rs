//! Executor churn: the lifecycle core (allocator, snapshots, removals) driving a simulated
//! backend that creates, lists, drains and deletes executors, as the cluster manager would.

use super::*;

impl Sim {
    /// On half the seeds (drawn from a separate stream, so the other half keep their
    /// scenarios), an allocator with churn (see the module docs).
    pub(super) fn plan_churn(&mut self) {
        let mut rng = Rng::new(self.seed ^ 0x5eed_c4a7_11fe_c7c1);
        if !rng.chance(0.5) {
            return;
        }
        let dynamic = rng.chance(0.5).then(|| DynamicConfig {
            min: 1,
            max: rng.range(2, 5) as u32,
            tasks_per_executor: rng.range(1, 4) as u32,
            idle_timeout_us: rng.range(5_000, 100_000),
        });
        let initial_target = rng.range(1, 4) as u32;
        let live_max = match &dynamic {
            Some(d) => d.max as usize,
            None => initial_target as usize,
        };
        let allocator = AllocatorConfig {
            batch_size: rng.range(1, 3) as u32,
            batch_delay_us: rng.range(0, 30_000),
            pending_timeout_us: 100_000,
            failures_max: u32::MAX,
            initial_target,
            dynamic,
            name_prefix: "churn-".into(),
        };
        let config = LifecycleConfig {
            tick_us: rng.range(0, 30_000),
            sync_grace_us: rng.range(0, 50_000),
            drain_timeout_us: rng.range(20_000, 200_000),
            ..LifecycleConfig::new(Allocation::Create(allocator))
        };
        self.churn = Some(Churn {
            lifecycle: Lifecycle::new(config, 0),
            ids: BTreeMap::new(),
            names: BTreeMap::new(),
            crash_prob: [0.0, 0.2, 0.5][rng.range(0, 2) as usize],
            live_max,
        });
        self.at(0, Ev::Lifecycle);
    }

    /// Tells the snapshot store about an allocator-created executor.
    pub(super) fn churn_update(&mut self, id: ExecutorId, state: ExecutorState) {
        let now = self.now_us;
        if let Some(c) = self.churn.as_mut() {
            if let Some(name) = c.names.get(&id) {
                c.lifecycle.handle_update(name, state, now);
            }
        }
    }

    /// One round of the lifecycle loop.
    pub(super) fn lifecycle(&mut self) -> Result<(), SimError> {
        let Some(mut c) = self.churn.take() else {
            return Ok(());
        };
        let result = self.lifecycle_step(&mut c);
        self.churn = Some(c);
        let now = self.now_us;
        if self.open_jobs() > 0 || now < 400_000 {
            self.at(now + CHURN_TICK_US, Ev::Lifecycle);
        }
        result
    }

    pub(super) fn lifecycle_step(&mut self, c: &mut Churn) -> Result<(), SimError> {
        let now = self.now_us;
        self.report_load(c);
        c.lifecycle.handle_timeout(now);
        while let Some(output) = c.lifecycle.poll_output() {
            if self.verbose {
                eprintln!("{now:>9}   lifecycle {output:?}");
            }
            match output {
                LifecycleOutput::Create(names) => self.create_churn(c, names),
                LifecycleOutput::Drain(names) => self.drain_churn(c, names)?,
                LifecycleOutput::Delete { name, .. } => self.delete_churn(c, name)?,
                LifecycleOutput::Remove(name, reason) => self.remove_churn(c, name, reason)?,
                LifecycleOutput::List => self.list_churn(c),
                LifecycleOutput::Changed(..) => {}
                LifecycleOutput::RequestTotal(total) => {
                    return self.fail(format!("a creating allocator asked for a total {total}"));
                }
                LifecycleOutput::Stop(reason) => {
                    return self.fail(format!("allocator stopped: {reason}"));
                }
            }
        }
        let live = c.lifecycle.stats().allocator.peak as usize;
        if live > c.live_max {
            return self.fail(format!(
                "allocator kept {live} executors, more than {}",
                c.live_max
            ));
        }
        Ok(())
    }

    /// A gone executor's removal (of dead executors only) reaches the scheduler a little later.
    pub(super) fn remove_churn(
        &mut self,
        c: &mut Churn,
        name: String,
        reason: RemovalReason,
    ) -> Result<(), SimError> {
        let Some(&id) = c.ids.get(&name) else {
            return self.fail(format!("removal of unknown executor {name}"));
        };
        if self.execs.get(&id).is_some_and(|e| e.alive) {
            return self.fail(format!("removal of live {id:?} ({reason})"));
        }
        let t = self.now_us + self.rng.range(0, 5_000);
        self.at(t, Ev::Remove(id, reason));
        Ok(())
    }

    /// The poll source: every allocator-made executor whose process exists (started, not
    /// deleted, refused or crashed), running once registered.
    pub(super) fn list_churn(&mut self, c: &mut Churn) {
        let listing: Vec<(String, ExecutorState)> = (c.ids.iter())
            .filter_map(|(name, id)| {
                let e = self.execs.get(id)?;
                let exists = !e.deleted && !e.retired && (e.alive || !e.registered);
                let state = match (exists, e.alive && e.registered) {
                    (false, _) => return None,
                    (true, true) => ExecutorState::Running,
                    (true, false) => ExecutorState::Pending,
                };
                Some((name.clone(), state))
            })
            .collect();
        c.lifecycle.handle_listing(listing, self.now_us);
    }

    /// The lifecycle drains executors `names`: the scheduler stops offering them work.
    pub(super) fn drain_churn(
        &mut self,
        c: &mut Churn,
        names: Vec<String>,
    ) -> Result<(), SimError> {
        for name in names {
            let Some(&id) = c.ids.get(&name) else {
                return self.fail(format!("drain of unknown executor {name}"));
            };
            if !self.sched.handle_drain(id) {
                return self.fail(format!("drain of unregistered {id:?}"));
            }
            if let Some(e) = self.execs.get_mut(&id) {
                e.draining = true;
            }
        }
        Ok(())
    }

    /// Tells the lifecycle the backlog and each of its registered executors' busy cores.
    pub(super) fn report_load(&mut self, c: &mut Churn) {
        let now = self.now_us;
        let pending = self.sched.pending_tasks();
        let running = self.sched.unfinished_tasks().saturating_sub(pending);
        let executors: Vec<(&str, u32)> = c
            .ids
            .iter()
            .filter(|(_, id)| self.execs.get(id).is_some_and(|e| e.alive && e.registered))
            .filter_map(|(name, id)| {
                let (cores, free) = self.sched.executor_cores(*id)?;
                Some((name.as_str(), cores - free))
            })
            .collect();
        c.lifecycle.handle_load(pending, running, executors, now);
    }

    /// The allocator created executors `names`: each gets an id and cores, most register, some
    /// crash later.
    pub(super) fn create_churn(&mut self, c: &mut Churn, names: Vec<String>) {
        let now = self.now_us;
        for name in names {
            let id = ExecutorId(CHURN_ID_BASE + self.report.executors_created);
            self.report.executors_created += 1;
            let info = ExecutorInfo {
                id,
                host: "host-churn".into(),
                cores: self.rng.range(1, 3) as u32,
                attributes: Vec::new(),
            };
            self.execs.insert(id, SimExec::new(info, 1));
            c.ids.insert(name.clone(), id);
            c.names.insert(id, name.clone());
            // One in ten never registers (the pending timeout deletes it).
            if !self.rng.chance(0.1) {
                let t = now + self.rng.range(1_000, 30_000);
                self.at(t, Ev::Register(id));
            }
            if self.rng.chance(c.crash_prob) {
                let t = now + self.rng.range(5_000, 200_000);
                self.at(t, Ev::Exit(id));
            }
        }
    }

    /// The lifecycle deleted executor `name`: it stops at once (a drained one runs nothing
    /// unless its drain timed out).
    pub(super) fn delete_churn(&mut self, c: &mut Churn, name: String) -> Result<(), SimError> {
        let now = self.now_us;
        let Some(&id) = c.ids.get(&name) else {
            return self.fail(format!("deletion of unknown executor {name}"));
        };
        if let Some(e) = self.execs.get_mut(&id) {
            e.deleted = true;
            e.alive = false;
            e.running.clear();
        }
        c.lifecycle
            .handle_update(&name, ExecutorState::Deleted, now);
        Ok(())
    }
}
