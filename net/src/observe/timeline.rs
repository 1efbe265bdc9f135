//! The task timeline (Spark's event timeline, Dask's task stream): recent attempts as bars per
//! executor and lane, with how each ended, copies (speculative attempts) and kills marked.
//!
//! A bounded sample, kept by the driver's loop: the attempts tracked are those of the tasks
//! whose timing is sampled anyway (one in [`super::SAMPLE_EVERY`], by id: the status update of
//! any other task costs one modulo) and every copy; of those, at most [`BARS_PER_WINDOW`] start
//! a bar per [`WINDOW_US`], so at millions of tasks a second the last [`BARS_MAX`] bars still
//! span some 25 s, and at a few a second they hold every sampled attempt of the last minutes.
//! An attempt whose executor is removed before it reports ends as [`Outcome::Lost`].

use std::collections::VecDeque;
use std::sync::Arc;

use flint_engine::hash::FxHashMap;
use flint_engine::scheduler::{Attempt, ExecutorId, TaskId};
use serde::Serialize;

use crate::wire::TaskState;

/// Finished bars kept.
pub const BARS_MAX: usize = 2048;
/// The window over which bars are counted.
pub const WINDOW_US: u64 = 100_000;
/// Bars started per window at most (copies always get theirs).
pub const BARS_PER_WINDOW: u32 = 8;
/// Running bars a view shows at most (the newest).
pub const RUNNING_SHOWN_MAX: usize = 512;
/// Attempts tracked at once (beyond this, the tracking starts over).
const TRACKED_MAX: usize = 1 << 16;

/// How an attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Outcome {
    /// Not yet.
    Running,
    /// It finished.
    Succeeded,
    /// It failed.
    Failed,
    /// It was killed.
    Killed,
    /// Its executor was removed before it reported.
    Lost,
}

/// One attempt on the timeline (times on the driver's clock, microseconds since it started).
#[derive(Debug, Clone, Serialize)]
pub struct Bar {
    /// Its executor's id on the wire.
    pub executor: Arc<str>,
    /// The lane it was sent to (0 for local mode's).
    pub lane: u32,
    /// Its job.
    pub job: u64,
    /// Its task's index in the job.
    pub task: u32,
    /// Its attempt number.
    pub attempt: u32,
    /// When it was launched.
    pub start_us: u64,
    /// When it ended (`None` while it runs).
    pub end_us: Option<u64>,
    /// How it ended.
    pub outcome: Outcome,
    /// Whether it is a copy of a running attempt (speculative).
    pub copy: bool,
    /// When the driver asked for it to be killed, if it did.
    pub kill_us: Option<u64>,
}

/// An attempt tracked from its launch.
#[derive(Debug, Clone)]
pub struct Tracked {
    /// When it was launched.
    pub at_us: u64,
    /// Its bar, if it has one.
    bar: Option<Box<Bar>>,
    executor: ExecutorId,
}

/// The timeline's record (see the module docs).
#[derive(Debug, Default)]
pub struct Timeline {
    tracked: FxHashMap<Attempt, Tracked>,
    copies_tracked: usize,
    bars: VecDeque<Bar>,
    window_end_us: u64,
    window_bars: u32,
}

/// Where and how an attempt was launched.
#[derive(Debug, Clone, Copy)]
pub struct Launch<'a> {
    /// The task.
    pub task: TaskId,
    /// Its attempt number.
    pub attempt: u32,
    /// Its executor.
    pub executor: ExecutorId,
    /// That executor's id on the wire.
    pub name: &'a Arc<str>,
    /// Its lane.
    pub lane: u32,
    /// Whether it is a copy.
    pub copy: bool,
}

impl Timeline {
    /// Whether an update of `task` may be of a tracked attempt (`sampled`: its timing is).
    #[inline]
    pub fn may_track(&self, sampled: bool) -> bool {
        sampled || self.copies_tracked > 0
    }

    /// An attempt was launched at `now_us`; `sampled` says whether its timing is.
    pub fn launched(&mut self, now_us: u64, l: Launch<'_>, sampled: bool) {
        if !sampled && !l.copy {
            return;
        }
        if self.tracked.len() >= TRACKED_MAX {
            self.tracked.clear();
            self.copies_tracked = 0;
        }
        if now_us >= self.window_end_us {
            self.window_end_us = now_us + WINDOW_US;
            self.window_bars = 0;
        }
        let bar = (l.copy || self.window_bars < BARS_PER_WINDOW).then(|| {
            self.window_bars += 1;
            Box::new(Bar {
                executor: l.name.clone(),
                lane: l.lane,
                job: l.task.job().0,
                task: l.task.index(),
                attempt: l.attempt,
                start_us: now_us,
                end_us: None,
                outcome: Outcome::Running,
                copy: l.copy,
                kill_us: None,
            })
        });
        self.copies_tracked += usize::from(l.copy);
        let tracked = Tracked {
            at_us: now_us,
            bar,
            executor: l.executor,
        };
        self.tracked
            .insert(Attempt::new(l.task, l.attempt), tracked);
    }

    /// The driver asked for an attempt to be killed.
    pub fn kill_sent(&mut self, now_us: u64, attempt: Attempt) {
        let bar = self.tracked.get_mut(&attempt).and_then(|t| t.bar.as_mut());
        if let Some(bar) = bar {
            bar.kill_us.get_or_insert(now_us);
        }
    }

    /// An attempt reported its final `state`: its launch time, if it was tracked.
    pub fn ended(&mut self, now_us: u64, attempt: Attempt, state: TaskState) -> Option<u64> {
        let tracked = self.tracked.remove(&attempt)?;
        let outcome = match state {
            TaskState::Finished => Outcome::Succeeded,
            TaskState::Killed => Outcome::Killed,
            _ => Outcome::Failed,
        };
        Some(self.close(tracked, now_us, outcome))
    }

    /// An executor was removed: its tracked attempts end lost.
    pub fn executor_removed(&mut self, now_us: u64, executor: ExecutorId) {
        let lost: Vec<Attempt> = self
            .tracked
            .iter()
            .filter(|(_, t)| t.executor == executor)
            .map(|(key, _)| *key)
            .collect();
        for key in lost {
            if let Some(tracked) = self.tracked.remove(&key) {
                self.close(tracked, now_us, Outcome::Lost);
            }
        }
    }

    fn close(&mut self, tracked: Tracked, now_us: u64, outcome: Outcome) -> u64 {
        if let Some(mut bar) = tracked.bar {
            self.copies_tracked -= usize::from(bar.copy);
            bar.end_us = Some(now_us);
            bar.outcome = outcome;
            if self.bars.len() == BARS_MAX {
                self.bars.pop_front();
            }
            self.bars.push_back(*bar);
        }
        tracked.at_us
    }

    /// The bars, oldest first, then the newest [`RUNNING_SHOWN_MAX`] running ones.
    pub fn bars(&self) -> Vec<Bar> {
        let mut running: Vec<&Bar> = self
            .tracked
            .values()
            .filter_map(|t| t.bar.as_deref())
            .collect();
        running.sort_by_key(|b| b.start_us);
        let skip = running.len().saturating_sub(RUNNING_SHOWN_MAX);
        let mut bars: Vec<Bar> = self.bars.iter().cloned().collect();
        bars.extend(running[skip..].iter().map(|b| (*b).clone()));
        bars
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flint_engine::scheduler::JobId;

    fn launch(name: &Arc<str>, index: u32, attempt: u32, copy: bool) -> Launch<'_> {
        Launch {
            task: TaskId::new(JobId(1), index),
            attempt,
            executor: ExecutorId(7),
            name,
            lane: 1,
            copy,
        }
    }

    #[test]
    fn bars_mark_copies_kills_and_losses() {
        let name: Arc<str> = Arc::from("e1");
        let mut t = Timeline::default();
        t.launched(10, launch(&name, 0, 0, false), true);
        t.launched(20, launch(&name, 1, 0, false), false); // neither sampled nor a copy
        t.launched(30, launch(&name, 0, 1, true), false);
        assert!(t.may_track(false), "a copy is tracked");
        t.kill_sent(40, Attempt::new(TaskId::new(JobId(1), 0), 0));
        assert_eq!(
            t.ended(
                50,
                Attempt::new(TaskId::new(JobId(1), 0), 0),
                TaskState::Killed
            ),
            Some(10)
        );
        assert_eq!(
            t.ended(
                60,
                Attempt::new(TaskId::new(JobId(1), 1), 0),
                TaskState::Finished
            ),
            None
        );
        t.executor_removed(70, ExecutorId(7));
        assert!(!t.may_track(false), "no copy left");
        let bars = t.bars();
        assert_eq!(bars.len(), 2);
        assert_eq!(
            (
                bars[0].outcome,
                bars[0].kill_us,
                bars[0].copy,
                bars[0].end_us
            ),
            (Outcome::Killed, Some(40), false, Some(50))
        );
        assert_eq!((bars[1].outcome, bars[1].copy), (Outcome::Lost, true));
    }

    #[test]
    fn bars_are_bounded_per_window_and_in_all() {
        let name: Arc<str> = Arc::from("e");
        let mut t = Timeline::default();
        for i in 0..100 {
            t.launched(i, launch(&name, i as u32, 0, false), true);
        }
        assert_eq!(t.bars().len(), BARS_PER_WINDOW as usize);
        for i in 0..100u64 {
            let now = WINDOW_US * (i + 1);
            for k in 0..BARS_PER_WINDOW {
                let index = 1000 + (i as u32) * 100 + k;
                t.launched(now, launch(&name, index, 0, false), true);
                t.ended(
                    now + 1,
                    Attempt::new(TaskId::new(JobId(1), index), 0),
                    TaskState::Finished,
                );
            }
        }
        assert!(t.bars.len() <= BARS_MAX);
    }
}
