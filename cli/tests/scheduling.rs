//! Issue 14 through the `flint` binary: a poison task fails its job (item 7), the scheduling
//! flags are range-checked at parse time (item 9) and a pool file is read (item 8).

mod common;

use common::unique;

use std::process::Output;

fn flint(args: &[&str]) -> Output {
    common::run_flint(args)
}

/// Spark's SPARK-39955 ("executor lost could fail task set if task is running"): a task that
/// aborts every executor it runs on (`crash:1`) is charged each crash once the lifecycle
/// handler learns the exit was the app's (SIGABRT), so the job fails after `--max-failures`
/// crashes instead of taking down executors forever.
#[test]
fn a_poison_task_fails_its_job_after_max_failures_crashes() {
    let out = flint(&[
        "local",
        "--tasks",
        "1",
        "--task",
        "crash:1",
        "--executors",
        "2",
        "--max-failures",
        "2",
        "--json",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stdout.contains("\"failed\":1"), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("task 0 failed 2 times (max_failures = 2)"),
        "{stderr}"
    );
}

#[test]
fn scheduling_flags_out_of_range_exit_2_naming_the_flag() {
    let bad = std::env::temp_dir().join(format!("flint-pools-{}.toml", unique()));
    std::fs::write(&bad, "[pool.a]\nweight = 0\n").expect("write");
    let bad = bad.to_string_lossy().into_owned();
    let long_name = "h".repeat(254);
    let too_many = vec!["h"; 65].join(",");
    for (args, flag) in [
        (vec!["local", "--weight", "0"], "--weight"),
        (vec!["local", "--weight", "1001"], "--weight"),
        (vec!["local", "--priority", "5000"], "--priority"),
        (
            vec!["local", "--locality-wait-ms", "60001"],
            "--locality-wait-ms",
        ),
        (vec!["local", "--speculation", "maybe"], "--speculation"),
        (
            vec!["local", "--speculation-timeout-s", "0"],
            "--speculation-timeout-s",
        ),
        (vec!["local", "--exclusion", "sometimes"], "--exclusion"),
        (vec!["local", "--sharing", "lifo"], "--sharing"),
        (vec!["local", "--pool", ""], "--pool"),
        (
            vec!["local", "--pools", "/nonexistent/pools.toml"],
            "--pools",
        ),
        (vec!["local", "--pools", bad.as_str()], "--pools"),
        (vec!["local", "--prefer-hosts", ""], "--prefer-hosts"),
        (vec!["local", "--prefer-hosts", "a,,b"], "--prefer-hosts"),
        (
            vec!["local", "--prefer-hosts", &long_name],
            "--prefer-hosts",
        ),
        (vec!["local", "--prefer-hosts", &too_many], "--prefer-hosts"),
    ] {
        let out = flint(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(flag), "{args:?}: {stderr}");
    }
    // Kept when an assertion fails, to be read.
    std::fs::remove_file(&bad).expect("remove the pools file");
}

#[test]
fn a_job_runs_in_a_pool_read_from_a_file() {
    let path = std::env::temp_dir().join(format!("flint-pools-{}.toml", unique()));
    std::fs::write(
        &path,
        "[pool.batch]\nmode = \"fifo\"\nweight = 2\nmin_share = 1\n",
    )
    .expect("write");
    let path = path.to_string_lossy().into_owned();
    let out = flint(&[
        "local",
        "--tasks",
        "200",
        "--executors",
        "1",
        "--sharing",
        "fair",
        "--pools",
        &path,
        "--pool",
        "batch",
        "--weight",
        "2",
        "--priority",
        "1",
        "--locality-wait-ms",
        "0",
        "--exclusion",
        "on",
        "--speculation",
        "off",
        "--json",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("\"succeeded\":200"), "{stdout}");
    std::fs::remove_file(&path).expect("remove the pools file");
}

#[test]
fn a_job_whose_tasks_prefer_hosts_runs_whole_on_those_with_an_executor_and_those_without() {
    // `flint local`'s executors are on 127.0.0.1; no executor is on the other host, so its
    // tasks run anywhere once the locality wait is over.
    let out = flint(&[
        "local",
        "--tasks",
        "2000",
        "--executors",
        "2",
        "--prefer-hosts",
        "127.0.0.1,nowhere.example",
        "--locality-wait-ms",
        "5",
        "--json",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("\"succeeded\":2000"), "{stdout}");
    assert!(stdout.contains("\"failed\":0"), "{stdout}");
}
