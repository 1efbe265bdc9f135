//! The JSON API beside the pages, read by the pages' script and by `flint status --json`, and
//! for scripts (Spark's `/api/v1`, Ray's and Dask's REST APIs). Read-only `GET`s, with the
//! same token as the pages; times are microseconds on the role's clock (since it started) unless
//! a name says `unix_ms` or `_ms`.
//!
//! A driver:
//!
//! | path | what |
//! | --- | --- |
//! | `/api/v1/driver` | the summary: uptime, jobs (active, submitted, finished by outcome), tasks (pending, running, launched, succeeded, attempts failed and killed, copies), executors (live, registered, lost), kills sent |
//! | `/api/v1/jobs` | the newest 100 active jobs, newest first, then the last 50 finished ([`super::JobView`]: id, function, pool, state, tasks, tasks done, attempts failed, copies, submitted, duration, failure reasons, sampled task durations and scheduler delays as min/25/50/75/max, and while it runs its locality level, valid levels, attempts launched, pending and running) |
//! | `/api/v1/jobs/ID` | one of those jobs, with its recent attempt failures (`404` for a job not among them) |
//! | `/api/v1/executors` | registered executors, then recently removed ones with why ([`super::ExecutorView`]) |
//! | `/api/v1/failures` | the last 50 attempt failures, newest first |
//! | `/api/v1/timeline` | `now_us` and the timeline's bars ([`super::timeline`]) |
//! | `/api/v1/series` | `now_us`, the spacing and the live charts' points ([`super::series`]) |
//!
//! A master (a worker answers the same about itself): `/api/v1/cluster` (all three lists, the
//! document `flint status --json` prints: workers with id, host, port, state, cores, cores used,
//! memory and memory used in MiB; applications with id, name, state, cores granted, executors
//! requested, why it waits; executors with app id, id, worker id, cores, state),
//! `/api/v1/workers`, `/api/v1/applications`, `/api/v1/executors`.

use serde::Serialize;
use serde_json::{json, Value};

use super::http::Response;
use super::series::POINT_EVERY_US;
use super::{ClusterView, DriverView};

/// The API's paths start with this.
pub const PREFIX: &str = "/api/v1/";

/// A `200` with `value` as JSON.
pub fn json_response(value: &impl Serialize) -> Response {
    match serde_json::to_vec(value) {
        Ok(body) => Response::ok("application/json", body),
        Err(error) => Response::text(500, format!("cannot encode: {error}\n")),
    }
}

fn not_found(what: &str) -> Response {
    let mut response = json_response(&json!({ "error": what }));
    response.status = 404;
    response
}

/// The driver's summary document.
pub fn driver_summary(v: &DriverView) -> Value {
    let live = v.executors.iter().filter(|e| e.removed.is_empty()).count();
    json!({
        "uptime_us": v.uptime.as_micros() as u64,
        "jobs": {
            "active": v.active_jobs,
            "submitted": v.jobs_submitted,
            "succeeded": v.jobs_over[0],
            "failed": v.jobs_over[1],
            "cancelled": v.jobs_over[2],
        },
        "tasks": {
            "pending": v.pending_tasks,
            "running": v.running_tasks,
            "launched": v.stats.launched,
            "succeeded": v.stats.succeeded,
            "attempts_failed": v.stats.attempts_failed,
            "attempts_killed": v.stats.attempts_killed,
            "copies": v.stats.speculative_launched,
        },
        "executors": {
            "live": live,
            "registered": v.executors_registered,
            "lost": v.executors_lost,
        },
        "kills_sent": v.kills_sent,
    })
}

/// The answer to a driver's `path` under [`PREFIX`] (`None`: not an API path).
pub fn driver(path: &str, v: &DriverView) -> Option<Response> {
    let rest = path.strip_prefix(PREFIX)?;
    let now_us = v.uptime.as_micros() as u64;
    Some(match rest {
        "driver" => json_response(&driver_summary(v)),
        "jobs" => json_response(&v.jobs),
        "executors" => json_response(&v.executors),
        "failures" => json_response(&v.failures),
        "timeline" => json_response(&json!({ "now_us": now_us, "bars": v.timeline })),
        "series" => json_response(&json!({
            "now_us": now_us,
            "every_us": POINT_EVERY_US,
            "points": v.series,
        })),
        _ => match rest
            .strip_prefix("jobs/")
            .and_then(|id| id.parse::<u64>().ok())
        {
            Some(id) => job(id, v),
            None => not_found("no such API path"),
        },
    })
}

fn job(id: u64, v: &DriverView) -> Response {
    let Some(job) = v.jobs.iter().find(|j| j.id == id) else {
        return not_found("no such job among the active and recent ones");
    };
    let failures: Vec<_> = v.failures.iter().filter(|f| f.job == id).collect();
    let mut value = serde_json::to_value(job).unwrap_or(Value::Null);
    if let Value::Object(map) = &mut value {
        map.insert("recent_failures".into(), json!(failures));
    }
    json_response(&value)
}

/// The cluster document (`/api/v1/cluster`, `flint status --json`).
pub fn cluster_json(v: &ClusterView) -> String {
    serde_json::to_string(v).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

/// The answer to a master's or worker's `path` under [`PREFIX`] (`None`: not an API path).
pub fn cluster(path: &str, v: &ClusterView) -> Option<Response> {
    Some(match path.strip_prefix(PREFIX)? {
        "cluster" => json_response(v),
        "workers" => json_response(&v.workers),
        "applications" => json_response(&v.apps),
        "executors" => json_response(&v.executors),
        _ => not_found("no such API path"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::{AppRow, JobView};
    use std::time::Duration;

    fn body(r: &Response) -> Value {
        serde_json::from_slice(&r.body).expect("json")
    }

    #[test]
    fn driver_paths_answer_json() {
        let mut v = DriverView {
            uptime: Duration::from_millis(1500),
            active_jobs: 1,
            ..DriverView::default()
        };
        v.jobs.push(JobView {
            id: 3,
            function: "f".into(),
            pool: "default".into(),
            tasks: 10,
            tasks_done: 4,
            attempts_failed: 0,
            copies: 0,
            state: "RUNNING",
            submitted_unix_ms: 0,
            duration: Duration::from_millis(2),
            failures: Vec::new(),
            task_durations: None,
            scheduler_delays: None,
            scheduling: None,
        });
        assert!(driver("/metrics", &v).is_none());
        let summary = body(&driver("/api/v1/driver", &v).unwrap());
        assert_eq!(summary["jobs"]["active"], 1);
        assert_eq!(summary["uptime_us"], 1_500_000);
        let jobs = body(&driver("/api/v1/jobs", &v).unwrap());
        assert_eq!(jobs[0]["duration_ms"], 2.0);
        let one = driver("/api/v1/jobs/3", &v).unwrap();
        assert_eq!(
            (one.status, body(&one)["tasks_done"].clone()),
            (200, json!(4))
        );
        assert_eq!(driver("/api/v1/jobs/4", &v).unwrap().status, 404);
        assert_eq!(driver("/api/v1/nothing", &v).unwrap().status, 404);
        let series = body(&driver("/api/v1/series", &v).unwrap());
        assert_eq!(series["every_us"], 1_000_000);
    }

    #[test]
    fn cluster_paths_answer_json() {
        let mut v = ClusterView::default();
        v.apps.push(AppRow {
            id: "app-1".into(),
            name: "n".into(),
            state: "WAITING".into(),
            cores_granted: 0,
            executors_requested: 2,
            waiting: "no alive worker".into(),
        });
        let all = body(&cluster("/api/v1/cluster", &v).unwrap());
        assert_eq!(all["applications"][0]["waiting"], "no alive worker");
        assert_eq!(
            body(&cluster("/api/v1/applications", &v).unwrap())[0]["id"],
            "app-1"
        );
        assert!(cluster("/", &v).is_none());
    }
}
