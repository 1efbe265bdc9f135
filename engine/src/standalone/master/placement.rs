//! Where the master places executors (Spark's `schedule()`; see the module docs of
//! [`super`]): applications first come first served, spread out or packed over the workers
//! with room.

use super::*;

impl Master {
    /// Places executors for waiting applications, first come first served.
    pub(super) fn schedule(&mut self) {
        if self.recovering_until_us.is_some() {
            return;
        }
        let mut order: Vec<(u64, String)> = self
            .apps
            .iter()
            .filter(|(_, a)| a.is_active() && a.connected)
            .map(|(id, a)| (a.seq, id.clone()))
            .collect();
        order.sort();
        for (_, app_id) in order {
            self.schedule_app(&app_id);
        }
    }

    /// Why an application does not have all it asked for; empty when it does.
    pub(super) fn waiting_reason(&self, a: &App) -> String {
        if !a.is_active() {
            return String::new();
        }
        let default_cores = self.config.default_cores;
        let room = self
            .config
            .executors_per_app_max
            .saturating_sub(a.executors.len() as u32);
        let wanted = a.wanted(default_cores).min(room);
        if wanted == 0 {
            let more = a
                .executor_limit
                .is_none_or(|limit| limit > a.executors.len() as u32);
            if more && a.spec.max_cores == 0 && default_cores > 0 {
                return format!(
                    "at the default maximum of {default_cores} cores per application (the master's --default-cores)"
                );
            }
            return String::new();
        }
        if self.recovering_until_us.is_some() {
            return "the master is recovering: waiting for journaled workers and drivers".into();
        }
        if !a.connected {
            return "its driver has not reconnected".into();
        }
        let (cores, memory_mb) = (a.cores_per_executor(), a.spec.memory_mb);
        let alive: Vec<&Worker> = self
            .workers
            .iter()
            .filter(|(id, w)| w.state == WorkerState::Alive && !a.avoided_workers.contains(*id))
            .map(|(_, w)| w)
            .collect();
        if alive.is_empty() {
            return "no alive worker".into();
        }
        if !alive
            .iter()
            .any(|w| w.spec.cores >= cores && w.spec.memory_mb >= memory_mb)
        {
            let most_cores = alive.iter().map(|w| w.spec.cores).max().unwrap_or(0);
            let most_memory = alive.iter().map(|w| w.spec.memory_mb).max().unwrap_or(0);
            return format!(
                "{NO_WORKER_FITS} an executor of {cores} cores and {memory_mb} MiB: the largest alive worker offers {most_cores} cores and {most_memory} MiB"
            );
        }
        let free: u32 = alive.iter().map(|w| w.free_cores()).sum();
        format!(
            "waiting for {wanted} more executors of {cores} cores and {memory_mb} MiB: other applications hold the resources ({free} cores free)"
        )
    }

    pub(super) fn schedule_app(&mut self, app_id: &str) {
        let Some(app) = self.apps.get(app_id) else {
            return;
        };
        let room = self
            .config
            .executors_per_app_max
            .saturating_sub(app.executors.len() as u32);
        let mut wanted = app.wanted(self.config.default_cores).min(room);
        if wanted == 0 {
            return;
        }
        let cores = app.cores_per_executor();
        let memory_mb = app.spec.memory_mb;
        // Usable workers by free cores, most first (ties by id, for determinism).
        let mut usable: Vec<(String, u32, u64)> = self
            .workers
            .iter()
            .filter(|(id, w)| w.fits(cores, memory_mb) && !app.avoided_workers.contains(*id))
            .map(|(id, w)| {
                (
                    id.clone(),
                    w.free_cores(),
                    w.spec.memory_mb.saturating_sub(w.memory_used_mb),
                )
            })
            .collect();
        usable.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let mut assigned = vec![0u32; usable.len()];
        let mut progress = true;
        while wanted > 0 && progress {
            progress = false;
            for (slot, (_, free_cores, free_memory_mb)) in usable.iter_mut().enumerate() {
                while wanted > 0 && *free_cores >= cores && *free_memory_mb >= memory_mb {
                    *free_cores -= cores;
                    *free_memory_mb -= memory_mb;
                    if let Some(count) = assigned.get_mut(slot) {
                        *count += 1;
                    }
                    wanted -= 1;
                    progress = true;
                    if self.config.spread_out {
                        break;
                    }
                }
                if wanted == 0 {
                    break;
                }
            }
        }
        for ((worker, _, _), count) in usable.into_iter().zip(assigned) {
            for _ in 0..count {
                self.launch(app_id, &worker, cores, memory_mb);
            }
        }
    }

    pub(super) fn launch(&mut self, app_id: &str, worker_id: &str, cores: u32, memory_mb: u64) {
        let (Some(app), Some(worker)) =
            (self.apps.get_mut(app_id), self.workers.get_mut(worker_id))
        else {
            return;
        };
        let executor = app.next_executor.to_string();
        app.next_executor += 1;
        app.executors.insert(
            executor.clone(),
            Executor {
                worker: worker_id.to_owned(),
                cores,
                memory_mb,
                state: ProcessState::Launching,
                placed_us: self.now_us,
            },
        );
        app.state = AppState::Running;
        worker.cores_used += cores;
        worker.memory_used_mb += memory_mb;
        worker
            .executors
            .insert((app_id.to_owned(), executor.clone()));
        let host_port = format!("{}:{}", worker.spec.host, worker.spec.port);
        self.outputs.push_back(Output::LaunchExecutor {
            worker: worker_id.to_owned(),
            app: app_id.to_owned(),
            executor: executor.clone(),
            cores,
            memory_mb,
        });
        self.outputs.push_back(Output::ExecutorAdded {
            app: app_id.to_owned(),
            executor,
            worker: worker_id.to_owned(),
            host_port,
            cores,
            memory_mb,
        });
    }
}
