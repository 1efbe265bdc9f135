//! The live charts' numbers over the last minutes: one [`Point`] per second the driver's loop
//! ran in (taken when a round ends past the next second, so an idle driver takes none and
//! never wakes for them), at most [`POINTS_MAX`]. A point holds the counters as they stood
//! (rates are differences between points, over their times), the gauges, and the latencies of
//! the jobs that ended and the sampled attempts that reported since the point before.

use std::collections::VecDeque;

use serde::Serialize;

use super::quantiles::{Fine, Summary};

/// Points kept (one a second: five minutes).
pub const POINTS_MAX: usize = 300;
/// The spacing of points.
pub const POINT_EVERY_US: u64 = 1_000_000;

/// The driver at one moment.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Point {
    /// When (microseconds since the driver started).
    pub t_us: u64,
    /// Attempts launched so far.
    pub launched: u64,
    /// Tasks succeeded so far.
    pub succeeded: u64,
    /// Attempts failed so far (killed included).
    pub attempts_failed: u64,
    /// Copies (speculative attempts) launched so far.
    pub copies: u64,
    /// Kills the driver sent so far.
    pub kills_sent: u64,
    /// Attempts running now.
    pub running: u64,
    /// Tasks waiting for a slot now.
    pub pending: u64,
    /// Jobs not over now.
    pub jobs_active: u64,
    /// Latencies (submit to end) of the jobs that ended since the point before.
    pub job_latency: Option<Summary>,
    /// Round trips (launch to final update) of the sampled attempts since the point before.
    pub round_trip: Option<Summary>,
}

/// The points and what the next one is measured against.
#[derive(Debug, Default)]
pub struct Series {
    points: VecDeque<Point>,
    next_us: u64,
    jobs_then: Fine,
    trips_then: Fine,
}

impl Series {
    /// Whether a point is due at `now_us`.
    #[inline]
    pub fn due(&self, now_us: u64) -> bool {
        now_us >= self.next_us
    }

    /// Takes `point` (its latencies filled from the histograms' growth since the last one).
    pub fn take(&mut self, mut point: Point, jobs: &Fine, trips: &Fine) {
        self.next_us = point.t_us - point.t_us % POINT_EVERY_US + POINT_EVERY_US;
        point.job_latency = jobs.summary_since(&self.jobs_then);
        point.round_trip = trips.summary_since(&self.trips_then);
        self.jobs_then.clone_from(jobs);
        self.trips_then.clone_from(trips);
        if self.points.len() == POINTS_MAX {
            self.points.pop_front();
        }
        self.points.push_back(point);
    }

    /// The points, oldest first.
    pub fn points(&self) -> Vec<Point> {
        self.points.iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_point_a_second_with_the_interval_latencies() {
        let mut series = Series::default();
        let (mut jobs, trips) = (Fine::default(), Fine::default());
        assert!(series.due(0));
        jobs.observe(100);
        series.take(
            Point {
                t_us: 0,
                ..Point::default()
            },
            &jobs,
            &trips,
        );
        assert!(!series.due(999_999) && series.due(1_000_000));
        series.take(
            Point {
                t_us: 1_500_000,
                ..Point::default()
            },
            &jobs,
            &trips,
        );
        assert!(series.due(2_000_000));
        let points = series.points();
        assert_eq!(points[0].job_latency.map(|s| s.p50_us), Some(100));
        assert_eq!(points[1].job_latency, None, "no job ended in between");
        for i in 0..400 {
            series.take(
                Point {
                    t_us: 2_000_000 * i,
                    ..Point::default()
                },
                &jobs,
                &trips,
            );
        }
        assert_eq!(series.points().len(), POINTS_MAX);
    }
}
