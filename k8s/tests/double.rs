//! Process tests against the API server test double: a real `flint-k8s submit` (or `flint
//! submit --master k8s://...`) process talks HTTP to the double on 127.0.0.1, whose kubelet
//! runs each pod as a real `flint executor` process that connects to the driver.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use flint_cli::summary::indexed_payload;
use flint_engine::functions::fnv1a64;
use flint_k8s::double::ApiDouble;
use serde_json::Value;

#[path = "../../cli/tests/common/gate.rs"]
mod gate;
use gate::Gate;

const NS: &str = "flint-test";
/// How long any one condition may take; generous for small shared CI machines.
const DEADLINE: Duration = Duration::from_secs(90);

fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + DEADLINE;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn expected_checksum(tasks: u64, payload: usize) -> u64 {
    (0..tasks).fold(0u64, |sum, i| {
        sum.wrapping_add(fnv1a64(&indexed_payload(i, payload)))
    })
}

fn bin_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_flint-k8s"))
        .parent()
        .expect("a target dir")
        .to_path_buf()
}

/// The `flint` binary (flint-cli's) beside `flint-k8s`, built if missing.
fn flint() -> PathBuf {
    static BUILT: std::sync::Once = std::sync::Once::new();
    let path = bin_dir().join("flint");
    BUILT.call_once(|| {
        if !path.is_file() {
            let profile = if bin_dir().ends_with("release") {
                vec!["--release"]
            } else {
                vec![]
            };
            let status = Command::new(env!("CARGO"))
                .args(["build", "-p", "flint-cli", "--bin", "flint"])
                .args(profile)
                .status()
                .expect("cargo runs");
            assert!(status.success(), "cannot build the flint binary");
        }
    });
    path
}

/// A test's scratch directory: removed when it is dropped, unless the test is failing (then
/// it stays, with the submitter's output and the pods' logs in it).
struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn scratch() -> Scratch {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "flint-k8s-test-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a scratch dir");
    Scratch(dir)
}

struct Submit {
    child: Child,
    dir: PathBuf,
}

impl Submit {
    /// Starts `flint-k8s submit` (or `flint submit` with `via_flint`) against the double.
    fn start(double: &ApiDouble, dir: &Path, via_flint: bool, extra: &[&str]) -> Submit {
        let exe = if via_flint {
            flint()
        } else {
            PathBuf::from(env!("CARGO_BIN_EXE_flint-k8s"))
        };
        let flint = flint();
        let master = format!("k8s://{}", double.url());
        let mut args: Vec<String> = [
            "submit",
            "--master",
            &master,
            "--namespace",
            NS,
            "--image",
            "flint:test",
            "--executor-command",
            flint.to_str().expect("a UTF-8 path"),
            "--cores",
            "1",
            "--batch-delay-ms",
            "100",
            "--payload",
            "8",
            "--json",
            "--executor-events",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        let child = Command::new(exe)
            .args(&args)
            .env("RUST_LOG", "warn,kube_client=off,flint_k8s=info")
            .stdout(std::fs::File::create(dir.join("stdout")).expect("stdout file"))
            .stderr(std::fs::File::create(dir.join("stderr")).expect("stderr file"))
            .stdin(Stdio::null())
            .spawn()
            .expect("submit starts");
        Submit {
            child,
            dir: dir.to_path_buf(),
        }
    }

    fn wait(&mut self) -> ExitStatus {
        let deadline = Instant::now() + DEADLINE;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                panic!("submit did not finish; stderr:\n{}", self.stderr());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.join("stderr")).unwrap_or_default()
    }

    /// Waits for exit 0 and returns the summary's JSON.
    fn succeeds(&mut self) -> Value {
        let status = self.wait();
        let stdout = std::fs::read_to_string(self.dir.join("stdout")).unwrap_or_default();
        assert!(
            status.success(),
            "submit failed ({status}): stdout {stdout}\nstderr:\n{}",
            self.stderr()
        );
        let line = stdout.lines().last().expect("a summary line");
        serde_json::from_str(line).expect("the summary is JSON")
    }
}

impl Drop for Submit {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_double(dir: &Path) -> ApiDouble {
    ApiDouble::start(dir.join("pods")).expect("the double starts")
}

fn running_pods(double: &ApiDouble) -> Vec<(String, u32)> {
    double
        .pods(NS)
        .into_iter()
        .filter(|p| p.phase == "Running" && !p.deleting)
        .filter_map(|p| Some((p.name, p.pid?)))
        .collect()
}

/// A pod template whose executor container logs at info, so its pod's log says when it has
/// registered with the driver (`registered_pods`); its path, for `--pod-template`.
fn logging_template(dir: &Path) -> String {
    let template = dir.join("template.json");
    std::fs::write(
        &template,
        r#"{"spec": {"containers": [{"name": "executor", "env": [{"name": "RUST_LOG", "value": "info"}]}]}}"#,
    )
    .expect("a template");
    template.to_str().expect("UTF-8").to_owned()
}

/// The running pods whose executor has registered with the driver (their log says so: pods
/// made with `logging_template`), with their pids. With a job of a gate's tasks and one task
/// slot each, an executor that registered holds an attempt until the gate opens.
fn registered_pods(double: &ApiDouble, dir: &Path) -> Vec<(String, u32)> {
    running_pods(double)
        .into_iter()
        .filter(|(name, _)| {
            std::fs::read_to_string(dir.join("pods").join(format!("{name}.log")))
                .is_ok_and(|log| log.contains("registered with the driver"))
        })
        .collect()
}

fn kill9(pid: u32) {
    let status = Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
}

fn nothing_left(double: &ApiDouble) {
    assert!(
        double.pods(NS).is_empty(),
        "pods left: {:?}",
        double.pods(NS).iter().map(|p| &p.name).collect::<Vec<_>>()
    );
    assert!(
        double.secrets(NS).is_empty(),
        "secrets left: {:?}",
        double.secrets(NS)
    );
}

fn num(summary: &Value, field: &str) -> u64 {
    summary[field]
        .as_u64()
        .unwrap_or_else(|| panic!("no {field} in {summary}"))
}

#[test]
fn flint_submit_k8s_runs_a_hash_job_to_the_right_checksum_and_leaves_no_pods_or_secret() {
    let dir = scratch();
    let double = start_double(&dir);
    let mut submit = Submit::start(
        &double,
        &dir,
        true,
        &[
            "--executors",
            "2",
            "--tasks",
            "500",
            "--task",
            "hash",
            "--app-id",
            "flint-first",
        ],
    );
    wait_until("two executor pods", || double.pods(NS).len() >= 2);
    // The secret reaches the container by reference only.
    for pod in double.pods(NS) {
        let env = pod.object["spec"]["containers"][0]["env"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let secret = env
            .iter()
            .find(|e| e["name"] == "FLINT_SECRET")
            .expect("FLINT_SECRET");
        assert!(secret["value"].is_null(), "plain secret in {pod:?}");
        assert_eq!(
            secret["valueFrom"]["secretKeyRef"]["name"],
            "flint-first-secret"
        );
        assert_eq!(
            pod.object["metadata"]["labels"]["flint-app-id"],
            "flint-first"
        );
        assert_eq!(pod.object["metadata"]["labels"]["flint-role"], "executor");
    }
    assert_eq!(double.secrets(NS), vec!["flint-first-secret".to_string()]);
    let summary = submit.succeeds();
    assert_eq!(num(&summary, "checksum"), expected_checksum(500, 8));
    assert_eq!(num(&summary, "succeeded"), 500);
    assert_eq!(num(&summary, "pods_created"), 2);
    nothing_left(&double);
}

#[test]
fn kill_9_of_an_executor_fails_its_pod_and_the_allocator_replaces_it() {
    let dir = scratch();
    let double = start_double(&dir);
    let gate = Gate::new();
    let (task, template) = (gate.task(), logging_template(&dir));
    let mut submit = Submit::start(
        &double,
        &dir,
        false,
        &[
            "--executors",
            "2",
            "--tasks",
            "300",
            "--task",
            &task,
            "--tasks-per-core",
            "1",
            "--pod-template",
            &template,
        ],
    );
    // Killed once registered (so holding one of the 300 tasks held at the gate): the job
    // cannot end before the gate opens, once the replacement exists.
    wait_until("two registered executors", || {
        registered_pods(&double, &dir).len() >= 2
    });
    let (victim, pid) = registered_pods(&double, &dir)[0].clone();
    kill9(pid);
    wait_until("the killed pod failed with 137", || {
        double.pods(NS).iter().any(|p| {
            p.name == victim
                && p.phase == "Failed"
                && p.object["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"]
                    == 137
        })
    });
    wait_until("a replacement pod", || double.counters().pods_created >= 3);
    gate.open();
    let summary = submit.succeeds();
    assert_eq!(num(&summary, "checksum"), expected_checksum(300, 8));
    assert!(num(&summary, "executors_failed") >= 1, "{summary}");
    assert!(num(&summary, "pods_created") >= 3, "{summary}");
    nothing_left(&double);
}

#[test]
fn a_410_and_a_cut_watch_stream_are_recovered_by_relisting() {
    let dir = scratch();
    let double = start_double(&dir);
    // No polling during the job: only the watch can tell the allocator a pod failed. Both kills
    // come while the job's tasks are held at the gate, which opens after the second
    // replacement.
    let gate = Gate::new();
    let (task, template) = (gate.task(), logging_template(&dir));
    let mut submit = Submit::start(
        &double,
        &dir,
        false,
        &[
            "--executors",
            "2",
            "--tasks",
            "500",
            "--task",
            &task,
            "--tasks-per-core",
            "1",
            "--poll-interval-ms",
            "600000",
            "--pod-template",
            &template,
        ],
    );
    wait_until("two registered executors", || {
        registered_pods(&double, &dir).len() >= 2
    });
    // 1. The history is compacted: the open watch gets 410 at the next change.
    let before = double.counters();
    double.compact();
    let (_, pid) = registered_pods(&double, &dir)[0].clone();
    kill9(pid);
    wait_until("a 410 and a re-list", || {
        let c = double.counters();
        c.gone > before.gone && c.pod_lists > before.pod_lists
    });
    wait_until("the first replacement", || {
        double.counters().pods_created >= 3
    });
    wait_until("two registered executors again", || {
        registered_pods(&double, &dir).len() >= 2
    });
    // 2. The stream is cut mid-job: the client re-lists and watches again.
    let before = double.counters();
    double.cut_watches();
    wait_until("a re-list and a new watch", || {
        let c = double.counters();
        c.pod_lists > before.pod_lists && c.watches > before.watches
    });
    let (_, pid) = registered_pods(&double, &dir)[0].clone();
    kill9(pid);
    wait_until("the second replacement", || {
        double.counters().pods_created >= 4
    });
    gate.open();
    let summary = submit.succeeds();
    assert_eq!(num(&summary, "checksum"), expected_checksum(500, 8));
    assert!(num(&summary, "watch_lists") >= 3, "{summary}");
    nothing_left(&double);
}

#[test]
fn five_seconds_of_500s_are_survived() {
    let dir = scratch();
    let double = start_double(&dir);
    let gate = Gate::new();
    let (task, template) = (gate.task(), logging_template(&dir));
    let mut submit = Submit::start(
        &double,
        &dir,
        false,
        &[
            "--executors",
            "2",
            "--tasks",
            "300",
            "--task",
            &task,
            "--tasks-per-core",
            "1",
            "--poll-interval-ms",
            "300",
            "--api-timeout-ms",
            "20000",
            "--pod-template",
            &template,
        ],
    );
    wait_until("two registered executors", || {
        registered_pods(&double, &dir).len() >= 2
    });
    double.fail_for(500, Duration::from_secs(5));
    // A failure during the outage: its replacement's create is retried until the API is back,
    // and the job (held at the gate) waits for it.
    let (_, pid) = registered_pods(&double, &dir)[0].clone();
    kill9(pid);
    wait_until("the replacement created", || {
        double.counters().pods_created >= 3
    });
    gate.open();
    let summary = submit.succeeds();
    assert_eq!(num(&summary, "checksum"), expected_checksum(300, 8));
    assert!(double.counters().injected > 0);
    assert!(num(&summary, "pods_created") >= 3, "{summary}");
    nothing_left(&double);
}

#[test]
fn a_pod_stuck_pending_past_the_timeout_is_deleted_and_replaced() {
    let dir = scratch();
    let double = start_double(&dir);
    double.stuck_pending(1);
    let mut submit = Submit::start(
        &double,
        &dir,
        false,
        &[
            "--executors",
            "2",
            "--tasks",
            "100",
            "--task",
            "hash",
            "--pending-timeout-ms",
            "1500",
        ],
    );
    let summary = submit.succeeds();
    assert_eq!(num(&summary, "checksum"), expected_checksum(100, 8));
    assert!(num(&summary, "pending_timeouts") >= 1, "{summary}");
    // The job waited for two running executors: the stuck pod's replacement was one of them.
    assert!(
        double.counters().pods_created >= 3,
        "{:?}",
        double.counters()
    );
    nothing_left(&double);
}

#[test]
fn dynamic_allocation_grows_and_shrinks_the_pods() {
    let dir = scratch();
    let double = start_double(&dir);
    // 300 tasks held at the gate, one slot per executor: a backlog that lasts until the test
    // has seen the maximum of 3 executors registered.
    let gate = Gate::new();
    let (task, template) = (gate.task(), logging_template(&dir));
    let mut submit = Submit::start(
        &double,
        &dir,
        false,
        &[
            "--executors",
            "1",
            "--max-executors",
            "3",
            "--idle-timeout-ms",
            "300",
            "--idle-wait-ms",
            "20000",
            "--tasks",
            "300",
            "--task",
            &task,
            "--tasks-per-core",
            "1",
            "--pod-template",
            &template,
        ],
    );
    wait_until("three registered executors", || {
        registered_pods(&double, &dir).len() == 3
    });
    gate.open();
    let summary = submit.succeeds();
    assert_eq!(num(&summary, "checksum"), expected_checksum(300, 8));
    assert_eq!(
        num(&summary, "executors_peak"),
        3,
        "grew to the maximum: {summary}"
    );
    assert_eq!(num(&summary, "executors_end"), 1, "shrank: {summary}");
    assert!(num(&summary, "executors_deleted") >= 1, "{summary}");
    nothing_left(&double);
}

#[test]
fn a_dead_api_server_fails_the_app_within_the_api_timeout() {
    let dir = scratch();
    let double = start_double(&dir);
    // The job's tasks are held at a gate this test never opens (until it ends): the job
    // cannot end on its own, whatever the machine's speed.
    let gate = Gate::new();
    let task = gate.task();
    let mut submit = Submit::start(
        &double,
        &dir,
        false,
        &[
            "--executors",
            "1",
            "--tasks",
            "1000",
            "--task",
            &task,
            "--tasks-per-core",
            "1",
            "--poll-interval-ms",
            "200",
            "--api-timeout-ms",
            "2000",
        ],
    );
    wait_until("a running executor", || !running_pods(&double).is_empty());
    double.fail_for(503, Duration::from_secs(3600));
    let started = Instant::now();
    let status = submit.wait();
    assert_eq!(status.code(), Some(2), "stderr:\n{}", submit.stderr());
    // Failing takes the API timeout plus cleanup's own bounded retries.
    assert!(started.elapsed() < Duration::from_secs(60));
}

#[test]
fn pods_left_by_a_previous_driver_are_deleted_first_and_pods_are_owned_by_the_driver_pod() {
    let dir = scratch();
    let double = start_double(&dir);
    let leftover = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "flint-again-exec-7", "labels": {"flint-app-id": "flint-again", "flint-role": "executor"}},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "executor", "image": "flint:test", "command": ["sleep", "600"]}]}
    });
    double.insert("pods", NS, leftover).expect("a leftover pod");
    wait_until("the leftover running", || !running_pods(&double).is_empty());
    // The driver "runs in" a pod: executor pods are owned by it.
    let driver_pod = double
        .insert(
            "pods",
            NS,
            serde_json::json!({
                "metadata": {"name": "the-driver"},
                "spec": {"containers": [{"name": "driver", "image": "flint:test", "command": ["sleep", "600"]}]}
            }),
        )
        .expect("a driver pod");
    let mut submit = Submit::start(
        &double,
        &dir,
        false,
        &[
            "--executors",
            "1",
            "--tasks",
            "50",
            "--task",
            "hash",
            "--app-id",
            "flint-again",
            "--driver-pod-name",
            "the-driver",
        ],
    );
    let mut seen = None;
    wait_until("an executor pod", || {
        seen = double
            .pods(NS)
            .into_iter()
            .find(|p| p.name == "flint-again-exec-0");
        seen.is_some()
    });
    let pod = seen.expect("the executor pod");
    let owner = &pod.object["metadata"]["ownerReferences"][0];
    assert_eq!(owner["kind"], "Pod");
    assert_eq!(owner["name"], "the-driver");
    assert_eq!(owner["uid"], driver_pod["metadata"]["uid"]);
    let summary = submit.succeeds();
    assert_eq!(num(&summary, "checksum"), expected_checksum(50, 8));
    let left: Vec<String> = double.pods(NS).into_iter().map(|p| p.name).collect();
    assert_eq!(
        left,
        vec!["the-driver".to_string()],
        "only the driver's pod is left"
    );
    assert!(double.secrets(NS).is_empty());
}

#[test]
fn sigterm_cancels_the_job_and_deletes_the_pods_and_the_secret() {
    let dir = scratch();
    let double = start_double(&dir);
    // The job's tasks are held at a gate this test never opens (until it ends): the job
    // cannot end on its own, whatever the machine's speed.
    let gate = Gate::new();
    let task = gate.task();
    let mut submit = Submit::start(
        &double,
        &dir,
        false,
        &[
            "--executors",
            "2",
            "--tasks",
            "1000",
            "--task",
            &task,
            "--tasks-per-core",
            "1",
        ],
    );
    wait_until("two running executors", || running_pods(&double).len() >= 2);
    let status = Command::new("kill")
        .args(["-TERM", &submit.child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
    assert_eq!(
        submit.wait().code(),
        Some(128 + 15),
        "stderr:\n{}",
        submit.stderr()
    );
    nothing_left(&double);
}

#[test]
fn slow_api_responses_only_slow_the_app_down() {
    let dir = scratch();
    let double = start_double(&dir);
    // Every request waits 300 ms for the first 3 s: the secret, the list, the watch, the creates.
    double.slow_for(Duration::from_millis(300), Duration::from_secs(3));
    let mut submit = Submit::start(
        &double,
        &dir,
        false,
        &["--executors", "2", "--tasks", "100", "--task", "hash"],
    );
    let summary = submit.succeeds();
    assert_eq!(num(&summary, "checksum"), expected_checksum(100, 8));
    assert_eq!(double.counters().pods_created, 2, "no create was repeated");
    nothing_left(&double);
}

#[test]
fn a_pod_the_api_server_refuses_stops_the_app_at_once() {
    let dir = scratch();
    let double = start_double(&dir);
    // A template whose sidecar has an invalid container name: the server answers 422.
    let template = dir.join("template.json");
    std::fs::write(
        &template,
        r#"{"spec": {"containers": [{"name": "executor"}, {"name": "Bad_Name", "image": "x"}]}}"#,
    )
    .expect("a template");
    let mut submit = Submit::start(
        &double,
        &dir,
        false,
        &[
            "--executors",
            "1",
            "--tasks",
            "10",
            "--task",
            "hash",
            "--pod-template",
            template.to_str().expect("UTF-8"),
        ],
    );
    assert_eq!(
        submit.wait().code(),
        Some(2),
        "stderr:\n{}",
        submit.stderr()
    );
    assert_eq!(double.counters().pods_created, 0);
    nothing_left(&double);
}

#[test]
fn too_many_requests_at_the_start_are_retried() {
    let dir = scratch();
    let double = start_double(&dir);
    // 429s from the first request on: the Secret, the leftover list and the first creates wait.
    double.fail_for(429, Duration::from_secs(2));
    let mut submit = Submit::start(
        &double,
        &dir,
        false,
        &["--executors", "2", "--tasks", "100", "--task", "hash"],
    );
    let summary = submit.succeeds();
    assert_eq!(num(&summary, "checksum"), expected_checksum(100, 8));
    assert!(double.counters().injected > 0);
    assert_eq!(double.counters().pods_created, 2);
    nothing_left(&double);
}

#[test]
fn a_hung_api_server_fails_the_app_within_the_api_timeout() {
    let dir = scratch();
    let double = start_double(&dir);
    // The job's tasks are held at a gate this test never opens (until it ends): the job
    // cannot end on its own, whatever the machine's speed.
    let gate = Gate::new();
    let task = gate.task();
    let mut submit = Submit::start(
        &double,
        &dir,
        false,
        &[
            "--executors",
            "1",
            "--tasks",
            "1000",
            "--task",
            &task,
            "--tasks-per-core",
            "1",
            "--poll-interval-ms",
            "200",
            "--api-timeout-ms",
            "2000",
        ],
    );
    wait_until("a running executor", || !running_pods(&double).is_empty());
    // Every request now waits 10 minutes for its answer.
    double.slow_for(Duration::from_secs(600), Duration::from_secs(3600));
    let started = Instant::now();
    let status = submit.wait();
    assert_eq!(status.code(), Some(2), "stderr:\n{}", submit.stderr());
    assert!(started.elapsed() < Duration::from_secs(60));
}

/// The executor pod as the double stored it, from one run of `flint-k8s submit` with every pod
/// setting and a pod template (shared by the tests below, one per setting).
fn configured_pod() -> &'static Value {
    static POD: std::sync::OnceLock<Value> = std::sync::OnceLock::new();
    POD.get_or_init(|| {
        let dir = scratch();
        let double = start_double(&dir);
        let template = dir.join("template.json");
        let json = serde_json::json!({
            "metadata": {"labels": {"team": "data", "tier": "template"},
                         "annotations": {"from": "template"}},
            "spec": {
                "nodeSelector": {"pool": "batch", "zone": "template"},
                "tolerations": [{"key": "gpu", "operator": "Exists"}],
                "imagePullSecrets": [{"name": "template-pull"}],
                "volumes": [{"name": "scratch", "emptyDir": {}}],
                "containers": [{"name": "executor", "image": "flint:template",
                    "resources": {"requests": {"ephemeral-storage": "1Gi"}}}]
            }
        });
        std::fs::write(&template, json.to_string()).expect("template");
        let mut submit = Submit::start(
            &double,
            &dir,
            false,
            &[
                "--executors",
                "1",
                "--tasks",
                "2",
                "--task",
                "sleep:300",
                "--memory-mb",
                "256",
                "--pod-template",
                template.to_str().expect("UTF-8"),
                "--node-selector",
                "zone=b",
                "--toleration",
                "spot=true:NoSchedule",
                "--image-pull-policy",
                "IfNotPresent",
                "--image-pull-secret",
                "registry",
                "--service-account",
                "flint-executor",
                "--label",
                "tier=flint",
                "--annotation",
                "owner=team-x",
                "--executor-grace-s",
                "45",
            ],
        );
        wait_until("the executor pod", || {
            assert!(
                submit.child.try_wait().is_ok_and(|s| s.is_none()),
                "{}",
                submit.stderr()
            );
            !double.pods(NS).is_empty()
        });
        let pod = double.pods(NS)[0].object.clone();
        let summary = submit.succeeds();
        assert_eq!(num(&summary, "succeeded"), 2);
        nothing_left(&double);
        pod
    })
}

fn executor_container(pod: &Value) -> &Value {
    let containers = pod["spec"]["containers"].as_array().expect("containers");
    containers
        .iter()
        .find(|c| c["name"] == "executor")
        .expect("the executor container")
}

#[test]
fn pod_setting_requests_and_limits_come_from_cores_and_memory() {
    let resources = &executor_container(configured_pod())["resources"];
    for kind in ["requests", "limits"] {
        assert_eq!(resources[kind]["cpu"], "1", "{resources}");
        assert_eq!(resources[kind]["memory"], "256Mi", "{resources}");
    }
    assert_eq!(
        resources["requests"]["ephemeral-storage"], "1Gi",
        "the template's stays"
    );
}

#[test]
fn pod_setting_node_selector_merges_over_the_templates() {
    let selector = &configured_pod()["spec"]["nodeSelector"];
    assert_eq!(selector["zone"], "b", "the flag wins");
    assert_eq!(selector["pool"], "batch", "the template's stays");
}

#[test]
fn pod_setting_tolerations_add_to_the_templates() {
    let tolerations = &configured_pod()["spec"]["tolerations"];
    assert_eq!(tolerations[0]["key"], "gpu");
    assert_eq!(
        tolerations[1],
        serde_json::json!({"key": "spot", "operator": "Equal", "value": "true", "effect": "NoSchedule"})
    );
}

#[test]
fn pod_setting_image_pull_policy_and_secrets() {
    let pod = configured_pod();
    assert_eq!(executor_container(pod)["imagePullPolicy"], "IfNotPresent");
    assert_eq!(
        executor_container(pod)["image"],
        "flint:test",
        "--image wins"
    );
    let secrets = &pod["spec"]["imagePullSecrets"];
    assert_eq!(
        *secrets,
        serde_json::json!([{"name": "template-pull"}, {"name": "registry"}])
    );
}

#[test]
fn pod_setting_service_account() {
    assert_eq!(
        configured_pod()["spec"]["serviceAccountName"],
        "flint-executor"
    );
}

#[test]
fn pod_setting_labels_and_annotations_merge_and_flints_own_labels_win() {
    let meta = &configured_pod()["metadata"];
    assert_eq!(meta["labels"]["tier"], "flint");
    assert_eq!(meta["labels"]["team"], "data");
    assert_eq!(meta["labels"]["flint-role"], "executor");
    assert_eq!(meta["annotations"]["owner"], "team-x");
    assert_eq!(meta["annotations"]["from"], "template");
}

#[test]
fn pod_setting_termination_grace_period_and_the_templates_volumes() {
    let spec = &configured_pod()["spec"];
    assert_eq!(spec["terminationGracePeriodSeconds"], 45);
    assert_eq!(spec["volumes"][0]["name"], "scratch");
    assert_eq!(spec["restartPolicy"], "Never", "Flint's own field");
}

/// `kubectl` against the double, with no kubeconfig; None (the test prints SKIPPED) when
/// there is no kubectl.
fn kubectl(double: &ApiDouble) -> Option<impl Fn(&[&str]) -> Command + '_> {
    let exe = std::env::var("KUBECTL").unwrap_or_else(|_| "kubectl".into());
    let found = Command::new(&exe)
        .args(["version", "--client"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        if std::env::var_os("FLINT_KUBECTL_REQUIRED").is_some() {
            panic!("kubectl is required (FLINT_KUBECTL_REQUIRED) and {exe} does not run");
        }
        return None;
    }
    Some(move |args: &[&str]| {
        let mut command = Command::new(&exe);
        command
            .args(["--server", &double.url(), "--namespace", NS])
            .args(["--request-timeout", "20s"])
            .args(args)
            .env("KUBECONFIG", "/dev/null")
            .env("HOME", std::env::temp_dir())
            .stdin(Stdio::null());
        command
    })
}

fn output(mut command: Command) -> String {
    let out = command.output().expect("kubectl runs");
    assert!(
        out.status.success(),
        "kubectl failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn kubectl_lists_watches_and_deletes_the_doubles_pods_and_reads_its_secrets() {
    let dir = scratch();
    let double = start_double(&dir);
    let Some(kubectl) = kubectl(&double) else {
        println!("SKIPPED kubectl: no kubectl on PATH (install Debian's kubernetes-client)");
        return;
    };
    let pod = |name: &str, app: &str| {
        serde_json::json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": app}},
            "spec": {"restartPolicy": "Never",
                "containers": [{"name": "c", "image": "i", "command": ["sleep", "30"]}]}})
    };
    double
        .insert("pods", NS, pod("mine", "flint"))
        .expect("a pod");
    double
        .insert("pods", NS, pod("other", "else"))
        .expect("a pod");
    let secret = serde_json::json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "s"}, "data": {"FLINT_SECRET": "c2VjcmV0"}});
    double.insert("secrets", NS, secret).expect("a secret");
    let listed = output(kubectl(&["get", "pods", "-l", "app=flint", "-o", "name"]));
    assert_eq!(listed, "pod/mine", "the label selector");
    let read = output(kubectl(&[
        "get",
        "secret",
        "s",
        "-o",
        "jsonpath={.data.FLINT_SECRET}",
    ]));
    assert_eq!(read, "c2VjcmV0");
    // A watch with a label selector sees the pod, then its deletion by kubectl.
    let watch_out = dir.join("watch");
    let mut watch = kubectl(&["get", "pods", "-l", "app=flint", "--watch", "-o", "json"])
        .stdout(std::fs::File::create(&watch_out).expect("watch file"))
        .stderr(Stdio::null())
        .spawn()
        .expect("kubectl watch");
    let seen = |what: &str| {
        std::fs::read_to_string(&watch_out)
            .unwrap_or_default()
            .contains(what)
    };
    wait_until("the watch to list the pod", || seen("\"name\": \"mine\""));
    output(kubectl(&["delete", "pod", "mine", "--wait=false"]));
    wait_until("the watch to see the deletion", || {
        seen("deletionTimestamp")
    });
    wait_until("the pod to go", || {
        double.pods(NS).iter().all(|p| p.name != "mine")
    });
    let _ = watch.kill();
    let _ = watch.wait();
    let left = output(kubectl(&["get", "pods", "-o", "name"]));
    assert_eq!(left, "pod/other");
    assert!(
        !seen("\"other\""),
        "the watch's selector keeps other pods out"
    );
}

#[test]
fn an_older_api_server_shape_fails_with_the_missing_field_named_and_no_panic() {
    let dir = scratch();
    let double = start_double(&dir);
    double.answer_as("1", "19", Some("items"));
    let mut submit = Submit::start(
        &double,
        &dir,
        false,
        &["--executors", "1", "--tasks", "1", "--task", "hash"],
    );
    let status = submit.wait();
    let stderr = submit.stderr();
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("Kubernetes 1.19"),
        "the version named: {stderr}"
    );
    assert!(
        stderr.contains("missing field `items`"),
        "the field named: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}
