//! The standalone master as an [`ExecutorSource`] for the lifecycle handler: the executor state
//! changes the master sends the application (watch) and a status round trip with the master
//! (poll), read through the [`AppClient`].
//!
//! The client keeps only executors that are not over, so an executor that ends is reported as
//! failed with an unknown exit code (-1), not caused by the application: its running tasks go
//! back to pending without counting against them.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use flint_engine::lifecycle::ExecutorState;

use crate::app_client::AppClient;
use crate::source::ExecutorSource;
use crate::wire;

/// The master's view of one application's executors.
pub struct MasterSource {
    client: Arc<AppClient>,
    known: BTreeMap<String, ExecutorState>,
    sync_timeout: Duration,
}

impl std::fmt::Debug for MasterSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MasterSource")
            .field("known", &self.known.len())
            .finish_non_exhaustive()
    }
}

impl MasterSource {
    /// A source reading `client`; a status round trip may take up to `sync_timeout`.
    pub fn new(client: Arc<AppClient>, sync_timeout: Duration) -> MasterSource {
        MasterSource {
            client,
            known: BTreeMap::new(),
            sync_timeout,
        }
    }

    fn current(&self) -> BTreeMap<String, ExecutorState> {
        self.client
            .info()
            .executors
            .into_iter()
            .map(|(id, (_, state))| (id, state_of(state)))
            .collect()
    }
}

/// What the master's executor state means for the lifecycle.
fn state_of(state: wire::ExecutorState) -> ExecutorState {
    match state {
        wire::ExecutorState::Launching => ExecutorState::Pending,
        wire::ExecutorState::Running => ExecutorState::Running,
        wire::ExecutorState::Killed => ExecutorState::Deleted,
        wire::ExecutorState::Exited => ExecutorState::Succeeded,
        wire::ExecutorState::Failed | wire::ExecutorState::Lost => ExecutorState::Failed {
            code: -1,
            caused_by_app: false,
        },
    }
}

impl ExecutorSource for MasterSource {
    fn changes(&mut self) -> Vec<(String, ExecutorState)> {
        let now = self.current();
        let mut changes = Vec::new();
        for (id, state) in &now {
            if self.known.get(id) != Some(state) {
                changes.push((id.clone(), state.clone()));
            }
        }
        for id in self.known.keys() {
            if !now.contains_key(id) {
                let ended = ExecutorState::Failed {
                    code: -1,
                    caused_by_app: false,
                };
                changes.push((id.clone(), ended));
            }
        }
        self.known = now;
        changes
    }

    fn full_listing(&mut self) -> Option<Vec<(String, ExecutorState)>> {
        let info = self.client.info();
        if !info.connected || info.removed.is_some() {
            return None;
        }
        self.client.sync(self.sync_timeout).ok()?;
        Some(self.current().into_iter().collect())
    }
}
