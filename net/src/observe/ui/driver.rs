//! The driver's pages: `/` (summary, live charts, task timeline, jobs, executors, recent
//! failures) and `/job?id=N` (one job: its progress, task duration and scheduler delay
//! quantiles, attempts and copies, pool and locality levels, failures). Tables are rendered
//! here and readable without JavaScript; the charts and the timeline are drawn by the page's
//! script from the JSON API (`/api/v1/series`, `/api/v1/timeline`).

use std::fmt::Write as _;
use std::time::Duration;

use super::{clock_text, duration_text, escape, stat};
use crate::observe::quantiles::Five;
use crate::observe::{DriverView, FailureView, JobView};

/// The driver's page.
pub fn page(v: &DriverView) -> String {
    let mut b = String::new();
    summary(&mut b, v);
    live_pictures(&mut b);
    jobs_table(&mut b, v);
    executors_table(&mut b, v);
    b.push_str("<h2>Recent failures</h2>");
    failures_table(&mut b, v.failures.iter());
    super::page("Flint driver", &b)
}

/// The driver page's summary: uptime, jobs, tasks, executors.
fn summary(b: &mut String, v: &DriverView) {
    b.push_str("<h1>Flint driver</h1><dl id=\"summary\" data-live>");
    stat(b, "uptime", "up", duration_text(v.uptime));
    stat(b, "jobs-active", "jobs active", v.active_jobs);
    stat(b, "tasks-pending", "tasks pending", v.pending_tasks);
    stat(b, "tasks-running", "tasks running", v.running_tasks);
    stat(b, "tasks-succeeded", "tasks succeeded", v.stats.succeeded);
    stat(
        b,
        "attempts-failed",
        "attempts failed",
        v.stats.attempts_failed,
    );
    stat(b, "copies", "copies", v.stats.speculative_launched);
    let live = v.executors.iter().filter(|e| e.removed.is_empty()).count();
    stat(b, "executors-live", "executors", live);
    stat(b, "executors-lost", "executors lost", v.executors_lost);
    b.push_str("</dl>");
}

/// The charts' and the timeline's places, drawn by the script.
fn live_pictures(b: &mut String) {
    b.push_str(
        "<h2>Last minutes</h2><noscript><p class=\"reason\">The charts and the timeline need \
         JavaScript; their numbers are at /api/v1/series and /api/v1/timeline, and the \
         tables below.</p></noscript><div id=\"charts\" class=\"charts\">",
    );
    for (id, title) in [
        ("chart-throughput", "tasks per second"),
        ("chart-load", "tasks running and pending"),
        ("chart-latency", "job latency (ms, log)"),
        ("chart-failures", "attempts failed and copied per second"),
    ] {
        let _ = write!(
            b,
            "<figure><figcaption>{title}</figcaption><svg id=\"{id}\" class=\"chart\" \
             viewBox=\"0 0 420 170\"></svg></figure>"
        );
    }
    b.push_str(
        "</div><h2>Task timeline</h2><p class=\"reason\">Sampled attempts per executor and \
         lane over the last 30 s: green succeeded, red failed, grey killed, orange lost, blue \
         running; a dashed outline is a copy, a cross where the driver sent a kill.</p>\
         <svg id=\"timeline\" viewBox=\"0 0 1200 60\"></svg>",
    );
}

/// The driver page's jobs, with their progress and failures.
fn jobs_table(b: &mut String, v: &DriverView) {
    b.push_str(
        "<h2>Jobs</h2><table id=\"jobs\" data-live><tr><th>id</th><th>function</th>\
        <th>pool</th><th>state</th><th>progress</th><th>tasks done</th><th>failed attempts</th>\
        <th>copies</th><th>submitted</th><th>duration</th><th>failures</th></tr>",
    );
    for j in &v.jobs {
        let failures: Vec<String> = j.failures.iter().map(|f| escape(f)).collect();
        let _ = write!(
            b,
            "<tr data-job=\"{id}\" data-state=\"{st}\" data-tasks=\"{t}\" data-done=\"{d}\">\
             <td><a href=\"/job?id={id}\">{id}</a></td><td>{f}</td><td>{p}</td>\
             <td class=\"s-{st}\">{st}</td><td><progress max=\"{t}\" value=\"{d}\"></progress>\
             </td><td class=\"num\">{d} / {t}</td><td class=\"num\">{fa}</td>\
             <td class=\"num\">{c}</td><td>{sub}</td><td class=\"num\">{dur}</td>\
             <td class=\"reason\">{fl}</td></tr>",
            id = j.id,
            f = escape(&j.function),
            p = escape(&j.pool),
            st = j.state,
            t = j.tasks,
            d = j.tasks_done,
            fa = j.attempts_failed,
            c = j.copies,
            sub = clock_text(j.submitted_unix_ms),
            dur = duration_text(j.duration),
            fl = failures.join("<br>"),
        );
    }
    if v.jobs_not_shown > 0 {
        let _ = write!(
            b,
            "<tr><td colspan=\"11\">and {} older active jobs</td></tr>",
            v.jobs_not_shown
        );
    }
    b.push_str("</table>");
}

/// The driver page's executors, the removed ones with why.
fn executors_table(b: &mut String, v: &DriverView) {
    b.push_str(
        "<h2>Executors</h2><table id=\"executors\" data-live><tr><th>id</th><th>host</th>\
        <th>cores</th><th>lanes</th><th>running</th><th>finished</th><th>failed</th>\
        <th>state</th></tr>",
    );
    for e in &v.executors {
        let state = match (e.removed.is_empty(), e.lost, e.health.as_str()) {
            (true, _, "suspected") => "SUSPECTED",
            (true, _, "stalled") => "STALLED",
            (true, _, "probation") => "PROBATION",
            (true, _, _) => "ALIVE",
            (false, true, _) => "LOST",
            (false, false, _) => "REMOVED",
        };
        let _ = write!(
            b,
            "<tr data-executor=\"{n}\" data-state=\"{state}\" data-running=\"{r}\" \
             data-finished=\"{fi}\" data-failed=\"{fa}\" data-lanes=\"{l}\"><td>{n}</td>\
             <td>{h}</td><td class=\"num\">{c}</td><td class=\"num\">{l}</td>\
             <td class=\"num\">{r}</td><td class=\"num\">{fi}</td><td class=\"num\">{fa}</td>\
             <td class=\"s-{state}\">{state} <span class=\"reason\">{why}</span></td></tr>",
            n = escape(&e.executor_id),
            h = escape(&e.host),
            c = e.cores,
            l = e.lanes_joined,
            r = e.tasks_running,
            fi = e.tasks_finished,
            fa = e.tasks_failed,
            why = escape(&e.removed),
        );
    }
    b.push_str("</table>");
}

/// Attempt failures, newest first.
fn failures_table<'a>(b: &mut String, failures: impl Iterator<Item = &'a FailureView>) {
    b.push_str(
        "<table id=\"failures\" data-live><tr><th>when</th><th>job</th><th>task</th>\
         <th>attempt</th><th>executor</th><th>reason</th></tr>",
    );
    for f in failures {
        let _ = write!(
            b,
            "<tr data-job=\"{j}\" data-task=\"{t}\"><td>{w}</td><td>{j}</td><td>{t}</td>\
             <td>{a}</td><td>{e}</td><td class=\"reason\">{r}</td></tr>",
            w = clock_text(f.unix_ms),
            j = f.job,
            t = f.index,
            a = f.attempt,
            e = escape(&f.executor_id),
            r = escape(&f.reason),
        );
    }
    b.push_str("</table>");
}

fn us_text(us: u64) -> String {
    if us < 1_000 {
        format!("{us} us")
    } else {
        duration_text(Duration::from_micros(us))
    }
}

/// One row of the job page's quantile table.
fn quantile_row(b: &mut String, id: &str, what: &str, five: Option<Five>) {
    let _ = write!(b, "<tr id=\"{id}\"><th>{what}</th>");
    match five {
        Some(q) => {
            for us in [q.min_us, q.p25_us, q.p50_us, q.p75_us, q.max_us] {
                let _ = write!(b, "<td class=\"num\" data-us=\"{us}\">{}</td>", us_text(us));
            }
            let _ = write!(b, "<td class=\"num\">{}</td></tr>", q.sampled);
        }
        None => b.push_str("<td colspan=\"6\">no sampled task yet</td></tr>"),
    }
}

/// One job's page, if the view holds it.
pub fn job_page(v: &DriverView, id: u64) -> Option<String> {
    let j = v.jobs.iter().find(|j| j.id == id)?;
    let mut b = String::new();
    let _ = write!(b, "<p><a href=\"/\">driver</a></p><h1>Job {id}</h1>");
    job_summary(&mut b, j);
    b.push_str(
        "<h2>Task times</h2><table id=\"quantiles\" data-live><tr><th></th><th>min</th>\
         <th>25th</th><th>median</th><th>75th</th><th>max</th><th>sampled</th></tr>",
    );
    quantile_row(
        &mut b,
        "q-duration",
        "duration (launch to result)",
        j.task_durations,
    );
    quantile_row(
        &mut b,
        "q-delay",
        "scheduler delay (submit to launch)",
        j.scheduler_delays,
    );
    b.push_str(
        "</table><p class=\"reason\">One task in 16 is timed; a sample of at most 512 per job.\
         </p><h2>Failures</h2><ul id=\"job-failures\" data-live>",
    );
    for reason in &j.failures {
        let _ = write!(b, "<li class=\"reason\">{}</li>", escape(reason));
    }
    b.push_str("</ul><h2>Recent failed attempts</h2>");
    failures_table(&mut b, v.failures.iter().filter(|f| f.job == id));
    Some(super::page(&format!("Flint job {id}"), &b))
}

/// The job page's summary: state, progress, attempts, pool, locality.
fn job_summary(b: &mut String, j: &JobView) {
    let _ = write!(
        b,
        "<dl id=\"job-summary\" data-live data-state=\"{}\" data-done=\"{}\">",
        j.state, j.tasks_done
    );
    stat(b, "job-state", "state", j.state);
    stat(b, "job-function", "function", escape(&j.function));
    stat(b, "job-pool", "pool", escape(&j.pool));
    stat(
        b,
        "job-done",
        "tasks done",
        format!("{} / {}", j.tasks_done, j.tasks),
    );
    stat(b, "job-failed", "attempts failed", j.attempts_failed);
    stat(b, "job-copies", "copies", j.copies);
    stat(b, "job-duration", "duration", duration_text(j.duration));
    if let Some(s) = &j.scheduling {
        stat(b, "job-launched", "attempts launched", s.attempts_launched);
        stat(b, "job-pending", "pending", s.pending);
        stat(b, "job-running", "running", s.running);
        stat(b, "job-locality", "locality level", s.locality_level);
        stat(b, "job-levels", "valid levels", s.valid_levels.join(", "));
    }
    b.push_str("</dl>");
}
