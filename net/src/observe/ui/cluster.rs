//! The master's page (workers, applications and why they wait, executors) and a worker's
//! (itself and its executors), from their status answer.

use std::fmt::Write as _;

use super::{escape, stat};
use crate::observe::metrics::ClusterRole;
use crate::observe::ClusterView;

/// The master's page (a worker's shows itself and its executors the same way).
pub fn page(role: ClusterRole, v: &ClusterView) -> String {
    let title = match role {
        ClusterRole::Master => "Flint master",
        ClusterRole::Worker => "Flint worker",
    };
    let mut b = String::new();
    cluster_summary(&mut b, title, v);
    workers_table(&mut b, v);
    if role == ClusterRole::Master {
        applications_table(&mut b, v);
    }
    cluster_executors_table(&mut b, v);
    super::page(title, &b)
}

/// The cluster page's summary: workers, cores, applications, executors.
fn cluster_summary(b: &mut String, title: &str, v: &ClusterView) {
    let _ = write!(b, "<h1>{title}</h1><dl id=\"summary\" data-live>");
    let alive: Vec<_> = v.workers.iter().filter(|w| w.state == "ALIVE").collect();
    let cores: u32 = alive.iter().map(|w| w.cores).sum();
    let used: u32 = alive.iter().map(|w| w.cores_used).sum();
    stat(b, "workers-alive", "workers alive", alive.len());
    stat(b, "cores-used", "cores used", format!("{used} / {cores}"));
    stat(
        b,
        "apps-running",
        "applications running",
        v.apps.iter().filter(|a| a.state == "RUNNING").count(),
    );
    stat(
        b,
        "apps-waiting",
        "applications waiting",
        v.apps.iter().filter(|a| a.state == "WAITING").count(),
    );
    stat(b, "executors-count", "executors", v.executors.len());
    b.push_str("</dl>");
}

/// The cluster page's workers and their resources.
fn workers_table(b: &mut String, v: &ClusterView) {
    b.push_str(
        "<h2>Workers</h2><table id=\"workers\" data-live><tr><th>id</th><th>address</th>\
        <th>state</th><th>cores used</th><th>memory used (MiB)</th></tr>",
    );
    for w in &v.workers {
        let _ = write!(
            b,
            "<tr data-worker=\"{id}\" data-state=\"{st}\" data-cores=\"{c}\" data-cores-used=\"{cu}\" \
             data-memory-mb=\"{m}\"><td>{id}</td><td>{a}</td><td class=\"s-{st}\">{st}</td>\
             <td class=\"num\">{cu} / {c}</td><td class=\"num\">{mu} / {m}</td></tr>",
            id = escape(&w.id),
            a = escape(&format!("{}:{}", w.host, w.port)),
            st = escape(&w.state),
            c = w.cores,
            cu = w.cores_used,
            m = w.memory_mb,
            mu = w.memory_used_mb,
        );
    }
    b.push_str("</table>");
}

/// The master page's applications, the waiting ones with why.
fn applications_table(b: &mut String, v: &ClusterView) {
    b.push_str(
        "<h2>Applications</h2><table id=\"applications\" data-live><tr><th>id</th><th>name</th>\
        <th>state</th><th>cores</th><th>executors requested</th><th>waiting because</th></tr>",
    );
    for a in &v.apps {
        let _ = write!(
            b,
            "<tr data-app=\"{id}\" data-state=\"{st}\" data-cores=\"{c}\"><td>{id}</td><td>{n}</td>\
             <td class=\"s-{st}\">{st}</td><td class=\"num\">{c}</td><td class=\"num\">{r}</td>\
             <td class=\"reason\">{w}</td></tr>",
            id = escape(&a.id),
            n = escape(&a.name),
            st = escape(&a.state),
            c = a.cores_granted,
            r = a.executors_requested,
            w = escape(&a.waiting),
        );
    }
    b.push_str("</table>");
}

/// The cluster page's executors.
fn cluster_executors_table(b: &mut String, v: &ClusterView) {
    b.push_str(
        "<h2>Executors</h2><table id=\"executors\" data-live><tr><th>application</th><th>id</th>\
        <th>worker</th><th>cores</th><th>state</th></tr>",
    );
    for e in &v.executors {
        let _ = write!(
            b,
            "<tr data-app=\"{a}\" data-executor=\"{id}\" data-worker=\"{w}\" data-state=\"{st}\">\
             <td>{a}</td><td>{id}</td><td>{w}</td><td class=\"num\">{c}</td>\
             <td class=\"s-{st}\">{st}</td></tr>",
            a = escape(&e.app),
            id = escape(&e.id),
            w = escape(&e.worker),
            c = e.cores,
            st = escape(&e.state),
        );
    }
    b.push_str("</table>");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_everything_a_peer_chose() {
        let view = ClusterView {
            workers: vec![crate::observe::WorkerRow {
                id: "<script>".into(),
                host: "h".into(),
                port: 1,
                state: "ALIVE".into(),
                cores: 2,
                cores_used: 1,
                memory_mb: 10,
                memory_used_mb: 0,
            }],
            ..ClusterView::default()
        };
        let html = page(ClusterRole::Master, &view);
        assert!(!html.contains("<script>"));
        assert!(html.contains("data-worker=\"&lt;script&gt;\""));
    }
}
