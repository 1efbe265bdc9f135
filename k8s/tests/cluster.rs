//! The process tests against a real cluster, run by `ci/k8s` (`--ignored` with `FLINT_K8S_REAL=1`,
//! `$KUBECONFIG`, `$FLINT_K8S_IMAGE`, `$FLINT_K8S_NAMESPACE`, `$FLINT_K8S_DRIVER_HOST`); ignored
//! elsewhere (a run with `--ignored` but without `FLINT_K8S_REAL=1` prints SKIPPED lines). The scenarios that need fault injection (410s,
//! cut streams, 500s, a stuck pod, a dead API server) run against the test double only
//! (`tests/double.rs`).

use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use flint_cli::summary::indexed_payload;
use flint_engine::functions::fnv1a64;
use serde_json::Value;

/// Pods on a real cluster take longer than processes: image pulls, scheduling.
const DEADLINE: Duration = Duration::from_secs(300);

struct Env {
    namespace: String,
    image: String,
    driver_host: String,
}

fn env(test: &str) -> Option<Env> {
    if std::env::var("FLINT_K8S_REAL").as_deref() != Ok("1") {
        println!("SKIPPED {test}: a real-cluster test (ci/k8s with $KUBECONFIG runs it)");
        return None;
    }
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("ci/k8s sets ${name}"));
    Some(Env {
        namespace: var("FLINT_K8S_NAMESPACE"),
        image: var("FLINT_K8S_IMAGE"),
        driver_host: var("FLINT_K8S_DRIVER_HOST"),
    })
}

fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + DEADLINE;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn expected_checksum(tasks: u64, payload: usize) -> u64 {
    (0..tasks).fold(0u64, |sum, i| {
        sum.wrapping_add(fnv1a64(&indexed_payload(i, payload)))
    })
}

fn app_id(test: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "flint-ci-{test}-{}-{}",
        std::process::id() % 100_000,
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

fn kubectl(env: &Env, args: &[&str]) -> (bool, String) {
    let out = Command::new("kubectl")
        .arg("-n")
        .arg(&env.namespace)
        .args(args)
        .output()
        .expect("kubectl runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// The app's pods as (name, phase, exit code if terminated).
fn pods(env: &Env, app: &str) -> Vec<(String, String, Option<i64>)> {
    let (ok, out) = kubectl(
        env,
        &[
            "get",
            "pods",
            "-l",
            &format!("flint-app-id={app}"),
            "-o",
            "json",
        ],
    );
    assert!(ok, "kubectl get pods");
    let list: Value = serde_json::from_str(&out).expect("JSON");
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            (
                p["metadata"]["name"].as_str().unwrap_or("").to_string(),
                p["status"]["phase"].as_str().unwrap_or("").to_string(),
                p["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"].as_i64(),
            )
        })
        .collect()
}

fn secret_exists(env: &Env, app: &str) -> bool {
    kubectl(env, &["get", "secret", &format!("{app}-secret")]).0
}

struct Submit {
    child: Child,
    out: PathBuf,
}

impl Submit {
    fn start(env: &Env, app: &str, extra: &[&str]) -> Submit {
        let exe = PathBuf::from(env!("CARGO_BIN_EXE_flint-k8s"));
        let out = std::env::temp_dir().join(format!("{app}.out"));
        let mut args: Vec<String> = [
            "submit",
            "--master",
            "k8s://",
            "--namespace",
            &env.namespace,
            "--image",
            &env.image,
            "--app-id",
            app,
            "--listen",
            "0.0.0.0:0",
            "--driver-address",
            &env.driver_host,
            "--payload",
            "8",
            "--json",
            "--wait-s",
            "240",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        let child = Command::new(exe)
            .args(&args)
            .stdout(std::fs::File::create(&out).expect("stdout file"))
            .stdin(Stdio::null())
            .spawn()
            .expect("flint-k8s starts");
        Submit { child, out }
    }

    fn wait(&mut self) -> ExitStatus {
        let deadline = Instant::now() + DEADLINE;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            assert!(Instant::now() < deadline, "flint-k8s did not finish");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn succeeds(&mut self) -> Value {
        let status = self.wait();
        let stdout = std::fs::read_to_string(&self.out).unwrap_or_default();
        assert!(status.success(), "flint-k8s failed ({status}): {stdout}");
        serde_json::from_str(stdout.lines().last().expect("a summary")).expect("JSON")
    }
}

impl Drop for Submit {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn num(summary: &Value, field: &str) -> u64 {
    summary[field]
        .as_u64()
        .unwrap_or_else(|| panic!("no {field} in {summary}"))
}

#[test]
#[ignore = "needs a real cluster: ci/k8s runs it"]
fn cluster_submit_runs_a_hash_job_and_leaves_no_pods_or_secret() {
    let Some(env) = env("cluster_submit_runs_a_hash_job_and_leaves_no_pods_or_secret") else {
        return;
    };
    let app = app_id("hash");
    let mut submit = Submit::start(
        &env,
        &app,
        &["--executors", "2", "--tasks", "2000", "--task", "hash"],
    );
    let summary = submit.succeeds();
    assert_eq!(num(&summary, "checksum"), expected_checksum(2000, 8));
    assert!(pods(&env, &app).is_empty());
    assert!(!secret_exists(&env, &app));
}

#[test]
#[ignore = "needs a real cluster: ci/k8s runs it"]
fn cluster_kill_9_of_an_executor_fails_its_pod_and_it_is_replaced() {
    let Some(env) = env("cluster_kill_9_of_an_executor_fails_its_pod_and_it_is_replaced") else {
        return;
    };
    let app = app_id("kill");
    let mut submit = Submit::start(
        &env,
        &app,
        &[
            "--executors",
            "2",
            "--tasks",
            "600",
            "--task",
            "hash:50",
            "--tasks-per-core",
            "1",
        ],
    );
    let mut victim = None;
    wait_until("two running executor pods", || {
        let running: Vec<String> = pods(&env, &app)
            .into_iter()
            .filter(|(_, phase, _)| phase == "Running")
            .map(|(name, ..)| name)
            .collect();
        victim = running.first().cloned();
        running.len() >= 2
    });
    let victim = victim.expect("a pod");
    // tini is PID 1; the executor is its child.
    let (ok, _) = kubectl(&env, &["exec", &victim, "--", "pkill", "-9", "-x", "flint"]);
    assert!(ok, "kubectl exec pkill");
    wait_until("the pod failed with 137 and a replacement", || {
        let all = pods(&env, &app);
        all.iter()
            .any(|(name, phase, code)| name == &victim && phase == "Failed" && *code == Some(137))
            && all.len() >= 3
    });
    let summary = submit.succeeds();
    assert_eq!(num(&summary, "checksum"), expected_checksum(600, 8));
    assert!(num(&summary, "executors_failed") >= 1);
    assert!(pods(&env, &app).is_empty());
    assert!(!secret_exists(&env, &app));
}

#[test]
#[ignore = "needs a real cluster: ci/k8s runs it"]
fn cluster_dynamic_allocation_grows_and_shrinks_the_pods() {
    let Some(env) = env("cluster_dynamic_allocation_grows_and_shrinks_the_pods") else {
        return;
    };
    let app = app_id("dyn");
    let mut submit = Submit::start(
        &env,
        &app,
        &[
            "--executors",
            "1",
            "--max-executors",
            "3",
            "--idle-timeout-ms",
            "1000",
            "--idle-wait-ms",
            "60000",
            "--tasks",
            "1500",
            "--task",
            "hash:20",
            "--tasks-per-core",
            "1",
        ],
    );
    let summary = submit.succeeds();
    assert_eq!(num(&summary, "checksum"), expected_checksum(1500, 8));
    assert!(num(&summary, "executors_peak") >= 2, "{summary}");
    assert_eq!(num(&summary, "executors_end"), 1, "{summary}");
    assert!(pods(&env, &app).is_empty());
}
