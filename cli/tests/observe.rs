//! Seeing a running cluster, with real processes: the driver's and the master's Prometheus
//! endpoints scraped and checked against the job's and the cluster's real state, the web UI
//! loaded in headless Chromium (Debian's `chromium`) with its DOM checked against the same
//! state and screenshots saved under `target/tmp/flint-ui/`, and `--log-format json`.
//!
//! Without Chromium the browser checks print `SKIPPED ui: ...` and the rest still runs;
//! `ci/ui` installs it and requires it (`FLINT_UI_REQUIRED=1`).

mod common;

use common::proc::{scratch, Proc};
use common::{free_port, wait_until, DEADLINE};

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use flint_net::handshake::Secret;
use flint_net::observe::{cluster_view, ClusterView};

const FLINT: &str = env!("CARGO_BIN_EXE_flint");
const SECRET: &str = "observe-test-secret";

/// One GET; the status code and the body ("" and 0 when nothing answers).
fn get(addr: SocketAddr, path: &str, bearer: Option<&str>) -> (u16, String) {
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
        return (0, String::new());
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let auth = bearer.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\n{auth}\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return (0, String::new());
    }
    let mut raw = String::new();
    let _ = stream.read_to_string(&mut raw);
    let Some((head, body)) = raw.split_once("\r\n\r\n") else {
        return (0, String::new());
    };
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, body.to_owned())
}

/// The value of one sample (`name{labels}` exactly as printed) in Prometheus text.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        let (name, value) = line.rsplit_once(' ')?;
        (name == series).then(|| value.parse().ok())?
    })
}

/// The sum of every sample of a metric (any labels).
fn sum_of(text: &str, metric: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{metric}{{")))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

fn scrape(addr: SocketAddr) -> String {
    let (status, body) = get(addr, "/metrics", Some(SECRET));
    if status == 200 {
        body
    } else {
        String::new()
    }
}

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

#[test]
fn driver_metrics_match_the_job_and_need_the_token() {
    let dir = scratch("driver");
    let (driver_port, metrics_port) = (free_port(), free_port());
    let listen = format!("127.0.0.1:{driver_port}");
    let metrics = addr(metrics_port);
    // The tasks wait on a gate the test opens once it has seen the job running.
    let gate = dir.join("gate");
    let task = format!("gate:{}", gate.display());
    let tasks: u32 = 3000;
    let mut driver = Proc::start(
        &dir,
        "driver",
        SECRET,
        &[
            "driver",
            "--listen",
            &listen,
            "--executors",
            "2",
            "--tasks",
            &tasks.to_string(),
            "--task",
            &task,
            "--json",
            "--metrics-listen",
            &metrics.to_string(),
            "--observe-linger-ms",
            "15000",
        ],
        &[],
    );
    // Served before any executor: with the secret set, nothing without the token.
    wait_until("the metrics endpoint", || {
        get(metrics, "/metrics", None).0 == 401
    });
    let (_, refused) = get(metrics, "/metrics?token=wrong", None);
    assert!(!refused.contains(SECRET));
    let text = scrape(metrics);
    assert_eq!(sample(&text, "flint_up"), Some(1.0), "{text}");
    assert_eq!(sample(&text, "flint_executors"), Some(0.0));
    let (status, _) = get(metrics, &format!("/metrics?token={SECRET}"), None);
    assert_eq!(status, 200, "the token in the query works too");

    // obs-1 has 2 cores, so it runs 2 lanes (connections).
    let executors: Vec<Proc> = (0..2)
        .map(|i| {
            let (id, cores) = (format!("obs-{i}"), (i + 1).to_string());
            Proc::start(
                &dir,
                &format!("exec-{i}"),
                SECRET,
                &[
                    "executor", "--driver", &listen, "--id", &id, "--cores", &cores,
                ],
                &[],
            )
        })
        .collect();
    // While it runs (held at the gate): the job is active, its tasks running, none finished.
    wait_until("the job running on both executors", || {
        let text = scrape(metrics);
        sample(&text, "flint_executors") == Some(2.0)
            && sample(&text, "flint_jobs_active") == Some(1.0)
            && sample(&text, "flint_tasks_running").unwrap_or(0.0) > 0.0
    });
    let text = scrape(metrics);
    assert_eq!(
        sample(&text, "flint_tasks_succeeded_total"),
        Some(0.0),
        "{text}"
    );
    // Held a few milliseconds more, so the attempts launched so far take over 1 ms.
    std::thread::sleep(Duration::from_millis(5));
    std::fs::write(&gate, b"").expect("open the gate");
    wait_until("all tasks succeeded in the metrics", || {
        let text = scrape(metrics);
        sample(&text, "flint_tasks_succeeded_total") == Some(f64::from(tasks))
            && sample(&text, "flint_jobs_finished_total{outcome=\"succeeded\"}") == Some(1.0)
    });
    let text = scrape(metrics);
    assert!(!text.contains(SECRET));
    assert_eq!(sample(&text, "flint_jobs_active"), Some(0.0));
    assert_eq!(sample(&text, "flint_jobs_submitted_total"), Some(1.0));
    assert_eq!(sample(&text, "flint_tasks_pending"), Some(0.0));
    assert_eq!(sample(&text, "flint_tasks_running"), Some(0.0));
    assert_eq!(sample(&text, "flint_executors"), Some(2.0));
    assert_eq!(sample(&text, "flint_executors_registered_total"), Some(2.0));
    assert_eq!(sample(&text, "flint_executors_lost_total"), Some(0.0));
    assert_eq!(sample(&text, "flint_task_attempts_failed_total"), Some(0.0));
    let launched = sample(&text, "flint_tasks_launched_total").expect("launched");
    let speculative = sample(&text, "flint_tasks_speculative_launched_total").expect("spec");
    assert_eq!(launched, f64::from(tasks) + speculative);
    // Every finished attempt is counted on the executor that ran it (speculative copies that
    // lost the race included, which the driver ignores as results).
    let per_executor = sum_of(&text, "flint_executor_tasks_finished_total");
    assert!(
        per_executor >= f64::from(tasks) && per_executor <= launched,
        "{per_executor}"
    );
    assert!(sample(
        &text,
        "flint_executor_tasks_finished_total{executor=\"obs-0\"}"
    )
    .is_some());
    assert_eq!(
        sample(&text, "flint_executor_lanes{executor=\"obs-0\"}"),
        Some(1.0)
    );
    assert_eq!(
        sample(&text, "flint_executor_lanes{executor=\"obs-1\"}"),
        Some(2.0),
        "a 2-core executor runs 2 lanes"
    );
    // One task in 16 is timed (job id plus index divisible by 16; this is job 1): 187 of the
    // 3000 (the queue time of attempt 0 only).
    let sampled = f64::from((0..tasks).filter(|i| (1 + i) % 16 == 0).count() as u32);
    assert_eq!(
        sample(&text, "flint_task_queue_seconds_count"),
        Some(sampled)
    );
    let round_trips = sample(&text, "flint_task_round_trip_seconds_count").expect("rt");
    assert!(round_trips >= sampled, "{round_trips}");
    assert_eq!(
        sample(&text, "flint_task_round_trip_seconds_bucket{le=\"+Inf\"}"),
        Some(round_trips)
    );
    // The first 16 tasks of each executor (slow start) were held at the gate over 1 ms, task 15
    // among them (timed), and none took a minute: the histogram counts seconds.
    let under_1ms = sample(&text, "flint_task_round_trip_seconds_bucket{le=\"0.001\"}");
    assert!(under_1ms.expect("1 ms bucket") < round_trips, "{text}");
    assert_eq!(
        sample(&text, "flint_task_round_trip_seconds_bucket{le=\"60.0\"}"),
        Some(round_trips)
    );
    assert!(sample(&text, "flint_net_frames_received_total").unwrap_or(0.0) > 0.0);
    // The driver's own summary agrees.
    assert!(driver.wait_exit().success(), "{}", driver.stderr());
    let summary = driver.stdout();
    assert!(
        summary.contains(&format!("\"succeeded\":{tasks}")),
        "{summary}"
    );
    drop(executors);
}

#[test]
fn json_logs_carry_the_job_span() {
    let dir = scratch("json");
    let mut local = Proc::start(
        &dir,
        "local",
        SECRET,
        &[
            "--log-format",
            "json",
            "local",
            "--executors",
            "1",
            "--tasks",
            "40",
            "--task",
            "fail:0.5",
            "--max-failures",
            "8",
        ],
        &[("RUST_LOG", "flint_net=info")],
    );
    let _ = local.wait_exit();
    let stderr = local.stderr();
    let json: Vec<&str> = stderr.lines().filter(|l| l.starts_with('{')).collect();
    assert!(
        json.iter()
            .any(|l| l.contains("\"message\":\"job submitted\"")
                && l.contains("\"name\":\"job\"")
                && l.contains("\"tasks\":40")),
        "{stderr}"
    );
    assert!(
        json.iter()
            .any(|l| l.contains("task attempt failed") && l.contains("\"attempt\":")),
        "{stderr}"
    );
    assert!(
        json.iter()
            .any(|l| l.contains("\"message\":\"job done\"") || l.contains("job failed")),
        "{stderr}"
    );
    assert!(json.iter().all(|l| l.ends_with('}')), "one object per line");
    // Everything else is the CLI's own output.
    for line in stderr.lines().filter(|l| !l.starts_with('{')) {
        assert!(line.starts_with("flint"), "not JSON: {line}");
    }
}

/// Debian's Chromium, if installed.
fn chromium() -> Option<PathBuf> {
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .find_map(|name| {
            std::env::var_os("PATH")?
                .to_str()?
                .split(':')
                .map(|d| Path::new(d).join(name))
                .find(|p| p.is_file())
        })
}

/// Runs headless Chromium with `args` then `url`; its stdout.
fn browse(chromium: &Path, profile: &Path, args: &[&str], url: &str) -> String {
    let output = Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .expect("run chromium");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn dom(chromium: &Path, profile: &Path, url: &str) -> String {
    browse(chromium, profile, &["--dump-dom"], url)
}

/// The `<tr ...>` opening tags of the table with this id.
fn rows<'a>(dom: &'a str, table: &str) -> Vec<&'a str> {
    let Some(start) = dom.find(&format!("<table id=\"{table}\"")) else {
        return Vec::new();
    };
    let end = dom[start..]
        .find("</table>")
        .map_or(dom.len(), |e| start + e);
    dom[start..end]
        .split("<tr ")
        .skip(1)
        .filter_map(|r| r.split_once('>').map(|(attrs, _)| attrs))
        .collect()
}

fn attr<'a>(row: &'a str, name: &str) -> Option<&'a str> {
    let key = format!("{name}=\"");
    let start = row.find(&key)? + key.len();
    let len = row[start..].find('"')?;
    Some(&row[start..start + len])
}

fn text_of<'a>(dom: &'a str, id: &str) -> Option<&'a str> {
    let key = format!("id=\"{id}\">");
    let start = dom.find(&key)? + key.len();
    let len = dom[start..].find('<')?;
    Some(&dom[start..start + len])
}

fn screenshot(chromium: &Path, profile: &Path, url: &str, name: &str) -> PathBuf {
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("flint-ui");
    std::fs::create_dir_all(&out).expect("screenshot dir");
    let path = out.join(name);
    let _ = std::fs::remove_file(&path);
    browse(
        chromium,
        profile,
        &[
            &format!("--screenshot={}", path.display()),
            "--window-size=1280,900",
        ],
        url,
    );
    let bytes = std::fs::read(&path).unwrap_or_default();
    assert!(
        bytes.starts_with(b"\x89PNG") && bytes.len() > 5_000,
        "no screenshot at {}",
        path.display()
    );
    println!("screenshot: {}", path.display());
    path
}

fn master_view(master: SocketAddr) -> ClusterView {
    cluster_view(master, Some(Secret::new(SECRET).expect("secret")), DEADLINE).unwrap_or_default()
}

#[test]
fn ui_in_chromium_shows_the_cluster_and_the_job() {
    let dir = scratch("ui");
    let browser = chromium();
    if browser.is_none() {
        assert!(
            std::env::var_os("FLINT_UI_REQUIRED").is_none(),
            "FLINT_UI_REQUIRED is set and no chromium is installed"
        );
        println!("SKIPPED ui: chromium is not installed (apt-get install chromium); metrics and pages are still checked over HTTP");
    }
    let profile = dir.join("chromium-profile");
    let (master_port, master_ui, master_metrics) = (free_port(), free_port(), free_port());
    let master_addr = addr(master_port);
    let _master = Proc::start(
        &dir,
        "master",
        SECRET,
        &[
            "master",
            "--listen",
            &master_addr.to_string(),
            "--worker-timeout-ms",
            "5000",
            "--heartbeat-interval-ms",
            "200",
            "--ui-listen",
            &addr(master_ui).to_string(),
            "--metrics-listen",
            &addr(master_metrics).to_string(),
        ],
        &[],
    );
    let workers: Vec<Proc> = (1..=2)
        .map(|i| {
            let listen = format!("127.0.0.1:{}", free_port());
            Proc::start(
                &dir,
                &format!("worker-{i}"),
                SECRET,
                &[
                    "worker",
                    "--master",
                    &master_addr.to_string(),
                    "--id",
                    &format!("w{i}"),
                    "--cores",
                    "2",
                    "--memory-mb",
                    "1024",
                    "--listen",
                    &listen,
                    "--work-dir",
                    &dir.join(format!("work-{i}")).display().to_string(),
                ],
                &[],
            )
        })
        .collect();
    wait_until("two alive workers in the master's metrics", || {
        let text = scrape(addr(master_metrics));
        sample(&text, "flint_workers{state=\"alive\"}") == Some(2.0)
    });
    let text = scrape(addr(master_metrics));
    assert_eq!(
        sample(&text, "flint_cores{state=\"free\"}"),
        Some(4.0),
        "{text}"
    );
    assert_eq!(sample(&text, "flint_cores{state=\"used\"}"), Some(0.0));
    assert_eq!(
        sample(&text, "flint_memory_mb{state=\"free\"}"),
        Some(2048.0)
    );
    assert_eq!(
        get(addr(master_ui), "/", None).0,
        401,
        "the page needs the token"
    );

    // The job's tasks wait on a gate the test opens once it has looked at the running job, so
    // the job is RUNNING for as long as the test needs, however fast the machine.
    let gate = dir.join("gate");
    let task = format!("gate:{}", gate.display());
    let tasks: u32 = 4000;
    let driver_ui = addr(free_port());
    let mut submit = Proc::start(
        &dir,
        "submit",
        SECRET,
        &[
            "submit",
            "--master",
            &master_addr.to_string(),
            "--executors",
            "2",
            "--cores",
            "1",
            "--tasks",
            &tasks.to_string(),
            "--task",
            &task,
            "--max-failures",
            "1000",
            "--json",
            "--name",
            "ui-test",
            "--ui-listen",
            &driver_ui.to_string(),
            "--observe-linger-ms",
            "20000",
        ],
        &[],
    );
    // Mid-job: the master runs the application on two executors, the driver runs the job.
    wait_until("the job running on two executors", || {
        let view = master_view(master_addr);
        let text = scrape(driver_ui);
        view.executors
            .iter()
            .filter(|e| e.state == "RUNNING")
            .count()
            == 2
            && sample(&text, "flint_executors") == Some(2.0)
            && sample(&text, "flint_tasks_running").unwrap_or(0.0) >= 2.0
            && sample(&text, "flint_jobs_active") == Some(1.0)
    });
    let master_text = scrape(addr(master_metrics));
    assert_eq!(
        sample(&master_text, "flint_applications{state=\"running\"}"),
        Some(1.0)
    );
    assert_eq!(
        sample(&master_text, "flint_executors_by_state{state=\"running\"}"),
        Some(2.0)
    );
    assert_eq!(
        sample(&master_text, "flint_cores{state=\"used\"}"),
        Some(2.0)
    );

    let master_url = format!("http://{}/?token={SECRET}", addr(master_ui));
    let driver_url = format!("http://{driver_ui}/?token={SECRET}");
    if let Some(browser) = &browser {
        let view = master_view(master_addr);
        let page = dom(browser, &profile, &master_url);
        assert!(!page.contains(&format!(">{SECRET}<")));
        let worker_rows = rows(&page, "workers");
        assert_eq!(worker_rows.len(), view.workers.len(), "{page}");
        for w in &view.workers {
            let row = worker_rows
                .iter()
                .find(|r| attr(r, "data-worker") == Some(w.id.as_str()))
                .unwrap_or_else(|| panic!("worker {} not on the page: {page}", w.id));
            assert_eq!(attr(row, "data-state"), Some(w.state.as_str()));
            assert_eq!(attr(row, "data-cores"), Some(w.cores.to_string().as_str()));
            assert_eq!(
                attr(row, "data-cores-used"),
                Some("1"),
                "spread out: one each"
            );
        }
        let apps = rows(&page, "applications");
        let app = view.apps.iter().find(|a| a.name == "ui-test").expect("app");
        let row = apps
            .iter()
            .find(|r| attr(r, "data-app") == Some(app.id.as_str()))
            .expect("the application's row");
        assert_eq!(attr(row, "data-state"), Some("RUNNING"));
        assert_eq!(attr(row, "data-cores"), Some("2"));
        let exec_rows = rows(&page, "executors");
        assert_eq!(exec_rows.len(), view.executors.len());
        assert!(exec_rows
            .iter()
            .all(|r| attr(r, "data-state") == Some("RUNNING")));
        assert_eq!(text_of(&page, "workers-alive"), Some("2"));
        screenshot(browser, &profile, &master_url, "master.png");

        let page = dom(browser, &profile, &driver_url);
        let job = rows(&page, "jobs");
        assert_eq!(job.len(), 1, "{page}");
        assert_eq!(attr(job[0], "data-state"), Some("RUNNING"));
        assert_eq!(attr(job[0], "data-tasks"), Some(tasks.to_string().as_str()));
        let execs = rows(&page, "executors");
        assert_eq!(execs.len(), 2);
        assert!(execs.iter().all(|r| attr(r, "data-state") == Some("ALIVE")));
        assert!(
            execs.iter().all(|r| attr(r, "data-lanes") == Some("1")),
            "1-core executors run one lane each"
        );
        screenshot(browser, &profile, &driver_url, "driver-running.png");
    } else {
        let (status, page) = get(driver_ui, "/", Some(SECRET));
        assert_eq!(status, 200);
        assert!(page.contains("data-state=\"RUNNING\""));
    }

    // Nothing ends while the gate is shut.
    let text = scrape(driver_ui);
    assert_eq!(
        sample(&text, "flint_tasks_succeeded_total"),
        Some(0.0),
        "{text}"
    );
    std::fs::write(&gate, b"").expect("open the gate");

    // After the job: the page shows it succeeded with every task, counted on its executors.
    wait_until("the job succeeded", || {
        let text = scrape(driver_ui);
        sample(&text, "flint_jobs_finished_total{outcome=\"succeeded\"}") == Some(1.0)
    });
    let text = scrape(driver_ui);
    assert_eq!(
        sample(&text, "flint_tasks_succeeded_total"),
        Some(f64::from(tasks))
    );
    if let Some(browser) = &browser {
        let page = dom(browser, &profile, &driver_url);
        let job = rows(&page, "jobs");
        assert_eq!(attr(job[0], "data-state"), Some("SUCCEEDED"), "{page}");
        assert_eq!(attr(job[0], "data-done"), Some(tasks.to_string().as_str()));
        let finished: u64 = rows(&page, "executors")
            .iter()
            .filter_map(|r| attr(r, "data-finished")?.parse::<u64>().ok())
            .sum();
        let per_executor = sum_of(&text, "flint_executor_tasks_finished_total") as u64;
        assert_eq!(finished, per_executor);
        assert!(finished >= u64::from(tasks));
        assert_eq!(
            text_of(&page, "tasks-succeeded"),
            Some(tasks.to_string().as_str())
        );
        screenshot(browser, &profile, &driver_url, "driver-done.png");
    }
    assert!(submit.wait_exit().success(), "{}", submit.stderr());
    assert!(submit.stdout().contains(&format!("\"succeeded\":{tasks}")));
    drop(workers);
}
