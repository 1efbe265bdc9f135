//! What the driver core shows: the views its callers ask the loop for (an allocator's
//! backlog, the stalled executors, everything the metrics and the web UI show), read from the
//! scheduler, the executors and the telemetry without changing them.

use flint_engine::scheduler::{ExecutorId, Scheduler};

use super::executors::{ExecutorLink, Executors};
use crate::driver::{ExecutorHealth, ExecutorsView};
use crate::observe::{DriverView, LoopTelemetry};

/// The backlog and the remote executors with the tasks running on each.
pub(super) fn executors(scheduler: &Scheduler, executors: &Executors) -> ExecutorsView {
    let pending_tasks = scheduler.pending_tasks();
    let running_tasks = scheduler.unfinished_tasks().saturating_sub(pending_tasks);
    let executors = (executors.remotes())
        .map(|(executor_id, id)| (executor_id.to_owned(), running_on(scheduler, id)))
        .collect();
    ExecutorsView {
        pending_tasks,
        running_tasks,
        executors,
    }
}

/// The executors that get less work or none, by their ids on the wire.
pub(super) fn health(scheduler: &Scheduler, executors: &Executors) -> ExecutorHealth {
    let names = |ids: Vec<ExecutorId>| ids.into_iter().map(|id| executors.name_of(id)).collect();
    let stalled = scheduler.stalled_executors().into_iter().map(|(id, _)| id);
    ExecutorHealth {
        stalled: names(stalled.collect()),
        suspected: names(scheduler.suspected_executors()),
        on_probation: names(scheduler.executors_on_probation()),
    }
}

/// What the driver shows at `now_us` (metrics, web UI).
pub(super) fn driver(
    scheduler: &Scheduler,
    executors: &Executors,
    telemetry: &LoopTelemetry,
    now_us: u64,
) -> DriverView {
    let scheduling = |job| scheduler.job_info(job);
    let mut view = telemetry.view(|id| running_on(scheduler, id), scheduling, now_us);
    let sick = health(scheduler, executors);
    for executor in view.executors.iter_mut() {
        let is = |list: &[String]| list.contains(&executor.executor_id);
        executor.health = match () {
            _ if is(&sick.suspected) => "suspected",
            _ if is(&sick.stalled) => "stalled",
            _ if is(&sick.on_probation) => "probation",
            _ => "",
        }
        .to_owned();
        let id = executors.id_of(&executor.executor_id);
        if let Some(ExecutorLink::Remote(remote)) = id.and_then(|id| executors.link(id)) {
            executor.lane_launches = remote.lanes.iter().map(|l| l.launched).collect();
            executor.lanes_joined = remote.lanes_joined();
        }
    }
    view.stats = scheduler.stats().clone();
    view.pending_tasks = scheduler.pending_tasks() as u64;
    view.running_tasks =
        (scheduler.unfinished_tasks()).saturating_sub(scheduler.pending_tasks()) as u64;
    (view.executors_registered, view.executors_lost) = executors.totals();
    view
}

/// A point of the live charts ([`crate::observe::series`]), taken when one is due.
#[cold]
pub(super) fn take_point(scheduler: &Scheduler, telemetry: &mut LoopTelemetry, now_us: u64) {
    let pending = scheduler.pending_tasks();
    let running = scheduler.unfinished_tasks().saturating_sub(pending);
    telemetry.take_point(now_us, scheduler.stats(), pending as u64, running as u64);
}

/// The slots in use on executor `id`.
fn running_on(scheduler: &Scheduler, id: ExecutorId) -> u32 {
    (scheduler.executor_cores(id)).map_or(0, |(slots, free)| slots.saturating_sub(free))
}
