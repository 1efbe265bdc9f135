//! What a seed plans before the run: the scheduler's settings, the executors, the jobs
//! (their tasks and settings) and the faults, all drawn from the seed's generator in a fixed
//! order (a seed replays exactly).

use super::*;

/// A random scheduler configuration for `seed`, drawn from `rng`.
pub(super) fn random_config(rng: &mut Rng, seed: u64) -> Config {
    Config {
        sharing: random_sharing(rng),
        pools: vec![
            PoolConfig {
                name: "a".into(),
                mode: random_sharing(rng),
                weight: 1,
                min_share: rng.range(0, 3) as u32,
            },
            PoolConfig {
                name: "b".into(),
                mode: random_sharing(rng),
                weight: 3,
                min_share: rng.range(0, 3) as u32,
            },
        ],
        max_failures: rng.range(1, 4) as u32,
        locality_wait_executor_us: rng.range(0, 20_000),
        locality_wait_host_us: rng.range(0, 20_000),
        exclusion: rng.chance(0.6).then(|| ExclusionConfig {
            task_executor_failures_max: rng.range(1, 2) as u32,
            task_host_failures_max: rng.range(1, 3) as u32,
            job_executor_failures_max: rng.range(1, 3) as u32,
            job_host_failures_max: rng.range(2, 5) as u32,
            executor_failures_max: rng.range(2, 6) as u32,
            host_excluded_executors_max: rng.range(1, 3) as u32,
            timeout_us: rng.range(50_000, 2_000_000),
        }),
        speculation: rng.chance(0.4).then(|| SpeculationConfig {
            multiplier: 1.5,
            quantile: 0.5,
            min_runtime_us: rng.range(0, 20_000),
            interval_us: rng.range(1_000, 50_000),
            timeout_us: rng.range(20_000, 2_000_000),
        }),
        hedging: rng.chance(0.5).then(|| HedgeConfig {
            percentile: 0.9,
            factor: 1.5 + rng.range(0, 3) as f64 * 0.5,
            floor_us: rng.range(100, 5_000),
            cold_us: rng.range(1_000, 100_000),
            min_samples: rng.range(3, 20) as u32,
            copy_ratio: 0.05 + rng.range(0, 5) as f64 * 0.1,
            burst: rng.range(2, 64) as u32,
            silence_min_us: rng.range(0, 20_000),
        }),
        slow_start_slots: if rng.chance(0.5) {
            u32::MAX
        } else {
            rng.range(1, 4) as u32
        },
        pending_tasks_max: if rng.chance(0.2) { 30 } else { 10_000 },
        result_bytes_max: 1 << 30,
        jobs_max: 100,
        executors_max: 1000,
        payload_max_bytes: 64,
        unschedulable_timeout_us: 3_000_000,
        // A third of the seeds build their jobs of task specs 1-4 tasks a tick, so jobs being
        // built meet every fault and input (`building.rs`); drawn from the seed, not the
        // generator, so the other seeds' scenarios stay as they were.
        build_chunk_tasks: match seed % 3 {
            0 => 1 + (seed / 3 % 4) as usize,
            _ => BUILD_CHUNK_TASKS,
        },
        seed,
    }
}

/// FIFO or FAIR, even odds.
pub(super) fn random_sharing(rng: &mut Rng) -> Sharing {
    if rng.chance(0.5) {
        Sharing::Fifo
    } else {
        Sharing::Fair
    }
}

impl Sim {
    /// Draws the scenario: executors (some late, some dying), jobs, cancellations, kills.
    pub(super) fn plan(&mut self) {
        let hosts = self.rng.range(1, 4);
        let n_execs = self.rng.range(1, 12);
        for i in 0..n_execs {
            self.plan_executor(i, hosts);
        }
        // A late replacement executor so loss never leaves the cluster empty for good.
        let id = ExecutorId(100);
        let info = ExecutorInfo {
            id,
            host: "host-late".into(),
            cores: 2,
            attributes: Vec::new(),
        };
        self.execs.insert(id, SimExec::new(info, 1));
        let t = self.rng.range(100_000, 400_000);
        self.at(t, Ev::Register(id));

        let n_jobs = self.rng.range(1, 6) as usize;
        for j in 0..n_jobs {
            self.plan_job(j, hosts, n_execs);
        }
        if self.seed % 4 == 2 {
            self.plan_service();
        }
    }

    /// A service's requests beside the jobs above, on the seeds whose `seed % 4 == 2`: 10-60
    /// one-task jobs of one function, submitted over the run, in bursts (more than the cores
    /// at once, now and then), some of a higher priority, some cancelled or killed. They launch at once or wait in the scheduler's line while the
    /// executors are busy (`scheduler/line.rs`), which `--against-walk` holds to a walk per
    /// assignment. Drawn from a generator of their own, so these seeds' other draws stay as
    /// they were.
    pub(super) fn plan_service(&mut self) {
        let mut rng = Rng::new(self.seed ^ 0x5E41_1CE5);
        let mut submit_us = 0;
        for _ in 0..rng.range(10, 60) {
            let j = self.jobs.len();
            let cores = match rng.chance(0.1) {
                true => TASK_CORES_MAX,
                false => 1,
            };
            let mut spec = JobSpec::new(Tasks::Same {
                function: "request".into(),
                cores,
                payloads: vec![Bytes::from(vec![7u8; 8])].into(),
            });
            spec.keep_results = rng.chance(0.5);
            spec.priority = i32::from(rng.chance(0.1));
            if rng.chance(0.3) {
                submit_us = rng.range(0, 300_000);
            }
            self.at(submit_us, Ev::Submit(j));
            if rng.chance(0.1) {
                self.at(submit_us + rng.range(0, 20_000), Ev::Cancel(j));
            }
            if rng.chance(0.05) {
                self.at(submit_us + rng.range(0, 20_000), Ev::KillTask(j, 0));
            }
            self.jobs.push(PlannedJob {
                spec,
                id: None,
                cancelled: false,
                outcome: None,
                oversized: false,
            });
        }
    }

    /// Executor `i` (of ids from 1, on one of `hosts` hosts): when it joins, maybe registers
    /// twice, maybe dies.
    pub(super) fn plan_executor(&mut self, i: u64, hosts: u64) {
        let id = ExecutorId(i + 1);
        let host = format!("host{}", self.rng.range(0, hosts - 1));
        let info = ExecutorInfo {
            id,
            host,
            cores: self.rng.range(1, 4) as u32,
            attributes: Vec::new(),
        };
        let slowness = if self.rng.chance(0.2) { 10 } else { 1 };
        self.execs.insert(id, SimExec::new(info, slowness));
        let join_us = if i == 0 || self.rng.chance(0.6) {
            0
        } else {
            self.rng.range(0, 200_000)
        };
        self.at(join_us, Ev::Register(id));
        if self.rng.chance(0.1) {
            self.at(join_us + 1, Ev::RegisterDuplicate(id));
        }
        if self.rng.chance(0.25) {
            let reason = match self.rng.range(0, 2) {
                0 => RemovalReason::Lost("heartbeat timeout".into()),
                1 => RemovalReason::Killed,
                _ => RemovalReason::Exited {
                    code: 137,
                    caused_by_app: self.rng.chance(0.5),
                },
            };
            let t = join_us + self.rng.range(1, 300_000);
            self.at(t, Ev::Die(id, reason));
        }
    }

    /// Job `j`: its tasks, settings and submission, maybe a cancellation and a task kill.
    pub(super) fn plan_job(&mut self, j: usize, hosts: u64, n_execs: u64) {
        let n_tasks = self.rng.range(0, 40);
        let oversized = self.rng.chance(0.05) && n_tasks > 0;
        // A third are one function over payloads (what the driver sends for a job without
        // locality), whose task records the scheduler builds as the tasks first leave.
        let mut spec = match self.rng.chance(0.3) {
            true => JobSpec::new(self.plain_tasks(n_tasks, oversized)),
            false => JobSpec::new(self.random_tasks(n_tasks, oversized, hosts, n_execs)),
        };
        self.random_settings(&mut spec, j, n_tasks);
        let submit_us = self.rng.range(0, 300_000);
        self.at(submit_us, Ev::Submit(j));
        if self.rng.chance(0.1) {
            let t = submit_us + self.rng.range(0, 100_000);
            self.at(t, Ev::Cancel(j));
        }
        if n_tasks > 0 && self.rng.chance(0.1) {
            let later = self.rng.range(0, 100_000);
            // The seeds that build jobs a chunk per tick kill half their tasks so killed at
            // the job's submission, while it is being built (`building.rs`).
            let t = match self.seed % 3 == 0 && j % 2 == 0 {
                true => submit_us,
                false => submit_us + later,
            };
            let i = self.rng.range(0, n_tasks - 1) as u32;
            self.at(t, Ev::KillTask(j, i));
        }
        self.jobs.push(PlannedJob {
            spec,
            id: None,
            cancelled: false,
            outcome: None,
            oversized,
        });
    }

    /// `n_tasks` tasks of one function and one size over payloads (the middle one over the
    /// payload limit if `oversized`), big now and then.
    pub(super) fn plain_tasks(&mut self, n_tasks: u64, oversized: bool) -> Tasks {
        let cores = match self.rng.chance(0.15) {
            true => TASK_CORES_MAX,
            false => 1,
        };
        let payloads = (0..n_tasks)
            .map(|i| match oversized && i == n_tasks / 2 {
                true => Bytes::from(vec![7u8; 100]),
                false => Bytes::from(vec![7u8; 8]),
            })
            .collect();
        Tasks::Same {
            function: "work".into(),
            cores,
            payloads,
        }
    }

    /// `n_tasks` tasks (the middle one over the payload limit if `oversized`), some big, some
    /// preferring one of `n_execs` executors or one of `hosts` hosts.
    pub(super) fn random_tasks(
        &mut self,
        n_tasks: u64,
        oversized: bool,
        hosts: u64,
        n_execs: u64,
    ) -> Vec<TaskSpec> {
        let mut tasks = Vec::new();
        for i in 0..n_tasks {
            let payload_len = if oversized && i == n_tasks / 2 {
                100
            } else {
                8
            };
            let mut t = TaskSpec::new("work", Bytes::from(vec![7u8; payload_len]));
            t.cores = if self.rng.chance(0.15) {
                TASK_CORES_MAX
            } else {
                1
            };
            if self.rng.chance(0.3) {
                t.preferred_executors
                    .push(ExecutorId(self.rng.range(1, n_execs + 1)));
            }
            if self.rng.chance(0.2) {
                t.preferred_hosts
                    .push(format!("host{}", self.rng.range(0, hosts)).into());
            }
            tasks.push(t);
        }
        tasks
    }

    /// Job `j`'s pool, weight, priority and per-job settings, drawn.
    pub(super) fn random_settings(&mut self, spec: &mut JobSpec, j: usize, n_tasks: u64) {
        spec.pool = match self.rng.range(0, 9) {
            // An unconfigured pool (FAIR inside, weight 1), now and then.
            0 => format!("job-{j}").into(),
            1..=4 => "a".into(),
            _ => "b".into(),
        };
        spec.weight = self.rng.range(1, 3) as u32;
        spec.priority = self.rng.range(0, 2) as i32;
        spec.keep_results = self.rng.chance(0.8);
        // Per-job settings (issue 14 item 9) on a fifth of the jobs each.
        if self.rng.chance(0.2) {
            spec.max_failures = Some(self.rng.range(1, 4) as u32);
        }
        if self.rng.chance(0.2) {
            spec.speculation = if self.rng.chance(0.5) {
                JobSetting::Off
            } else {
                JobSetting::custom(SpeculationConfig {
                    multiplier: 1.5,
                    quantile: 0.5,
                    min_runtime_us: self.rng.range(0, 20_000),
                    interval_us: self.rng.range(1_000, 50_000),
                    timeout_us: self.rng.range(20_000, 2_000_000),
                })
            };
        }
        if self.rng.chance(0.2) {
            spec.exclusion = if self.rng.chance(0.5) {
                JobSetting::Off
            } else {
                JobSetting::custom(ExclusionConfig {
                    task_executor_failures_max: self.rng.range(1, 2) as u32,
                    task_host_failures_max: self.rng.range(1, 3) as u32,
                    ..ExclusionConfig::default()
                })
            };
        }
        if self.rng.chance(0.1) {
            // Results are 8 bytes each: sometimes the bound is below what the job returns.
            spec.result_bytes_max = Some(self.rng.range(0, 8 * n_tasks + 8));
        }
    }
}
