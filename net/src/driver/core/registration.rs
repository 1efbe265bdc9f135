//! How an executor joins the driver: its registration on lane 0 (checked, refused with the
//! reason, or accepted into the scheduler) and its further lanes joining with the lane key.

use super::*;

impl DriverCore {
    /// Registers an executor on `peer` (its lane 0), or refuses it with the reason (told to
    /// the peer, whose connection closes).
    pub(super) fn register(
        &mut self,
        peer: PeerId,
        r: Registration<'_>,
        attributes: List<'_, wire::KeyValue<'_>>,
    ) -> Result<ExecutorId, ConnError> {
        let mut refusal = self.executors.refusal(&r);
        if self.stopping {
            refusal = Some("the driver is stopping".into());
        }
        if refusal.is_none() {
            let info = ExecutorInfo {
                id: self.executors.next_id(),
                host: r.host.to_owned(),
                cores: r.cores.saturating_mul(self.tasks_per_core()),
                attributes: attributes
                    .iter()
                    .map(|kv| (kv.key.to_owned(), kv.value.to_owned()))
                    .collect(),
            };
            refusal = (self.scheduler.handle_register(info, self.now_us).err())
                .map(|refused| refused.to_string());
        }
        if let Some(reason) = refusal {
            tracing::warn!(
                executor_id = r.executor_id,
                "registration refused: {reason}"
            );
            (self.peers).send(peer, &Message::RegisterExecutorFailed { reason: &reason });
            return Err(ConnError::Protocol(format!(
                "registration refused: {reason}"
            )));
        }
        let id = self.executors.next_id();
        let lane_key = self.executors.add_remote(&r, peer);
        let registered = Message::RegisteredExecutor {
            heartbeat_interval_ms: self.heartbeat_interval_ms(),
            lane_key,
        };
        self.send(peer, &registered);
        let Registration {
            executor_id,
            host,
            cores,
            lanes,
        } = r;
        tracing::info!(executor_id, host, cores, lanes, "executor registered");
        self.telemetry
            .executor_registered(id, executor_id, host, cores);
        debug_assert_eq!(self.executors.id_of(executor_id), Some(id));
        Ok(id)
    }

    /// A lane of a registered executor asks to join (see the module docs): its executor, or
    /// the refusal (told to the peer, whose connection closes).
    pub(super) fn join_lane(
        &mut self,
        peer: PeerId,
        executor_id: &str,
        lane: u32,
        lane_key: &[u8; 32],
    ) -> Result<ExecutorId, ConnError> {
        let id = match self.executors.join_lane(peer, executor_id, lane, lane_key) {
            Ok(id) => id,
            Err(reason) => {
                tracing::warn!(executor_id, lane, "lane refused: {reason}");
                (self.peers).send(peer, &Message::RegisterExecutorFailed { reason: &reason });
                return Err(ConnError::Protocol(format!("lane refused: {reason}")));
            }
        };
        let joined = Message::LaneJoined {
            heartbeat_interval_ms: self.heartbeat_interval_ms(),
        };
        self.send(peer, &joined);
        tracing::info!(executor_id, lane, "executor lane joined");
        Ok(id)
    }

    /// A registered lane: a member of the peer table, its heartbeats due.
    pub(super) fn open_lane(&mut self, peer: PeerId, executor: ExecutorId, lane: u32) {
        if let Some((phase, _)) = self.peers.open_mut(peer) {
            *phase = Phase::Executor(executor, lane);
        }
        self.peers.set_standing(peer, Standing::Member);
        debug_assert!(self.is_executor(peer));
    }

    pub(super) fn heartbeat_interval_ms(&self) -> u32 {
        u32::try_from(self.config.heartbeat_interval.as_millis()).unwrap_or(u32::MAX)
    }

    pub(super) fn tasks_per_core(&self) -> u32 {
        self.config.tasks_per_core.clamp(1, TASKS_PER_CORE_MAX)
    }
}
