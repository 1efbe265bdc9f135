//! Issue 11.10: every process pinned its first task thread to CPU 0, so executors on one machine
//! piled onto one core. Now an executor pins where `--pin-cores` says (nowhere by default), and
//! `flint local`'s executors get CPUs of their own. Checked from the kernel's view of each task
//! thread (`/proc/PID/task/TID/status`), with real `flint executor` processes.

mod common;

use common::{wait_until_or, DEADLINE};

use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use flint_engine::affinity::allowed_cpus;
use flint_engine::lifecycle::AllocatorConfig;
use flint_net::driver::Driver;
use flint_net::lifecycle::local::{LocalConfig, LocalExecutors};

/// The CPUs the kernel lets `pid`'s first task thread (`flint-task-0`) run on, once it exists.
/// The thread pins itself as the first thing it does, so for a moment after it appears it still
/// has its parent's mask: callers wait for the mask they expect, with a deadline.
fn task_thread_cpus(pid: u32) -> Option<Vec<usize>> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    for task in tasks.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim() != "flint-task-0" {
            continue;
        }
        let status = std::fs::read_to_string(task.path().join("status")).ok()?;
        let list = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?
            .trim()
            .to_owned();
        return Some(parse_list(&list));
    }
    None
}

fn parse_list(list: &str) -> Vec<usize> {
    let mut cpus = Vec::new();
    for part in list.split(',') {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let (a, b): (usize, usize) = (a.parse().expect("cpu"), b.parse().expect("cpu"));
        cpus.extend(a..=b);
    }
    cpus
}

fn executor(driver: &Driver, pin: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_flint"))
        .args(["executor", "--driver"])
        .arg(driver.local_addr().expect("listening").to_string())
        .args(["--pin-cores", pin, "--id", &format!("pin-{pin}")])
        .env_remove("FLINT_SECRET")
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn flint executor")
}

#[test]
fn an_executor_pins_its_task_thread_only_where_told() {
    let allowed = allowed_cpus();
    let last = *allowed.last().expect("some CPU");
    let driver = Driver::builder().start().expect("driver starts");
    let mut pinned = executor(&driver, &last.to_string());
    let mut free = executor(&driver, "none");
    driver
        .wait_for_executors(2, DEADLINE)
        .expect("both register");
    let cpus = || (task_thread_cpus(pinned.id()), task_thread_cpus(free.id()));
    let expected = Some(vec![last]);
    wait_until_or(
        "both task threads, one pinned",
        || {
            let (a, b) = cpus();
            a == expected && b.is_some()
        },
        || format!("{:?}", cpus()),
    );
    let cpus = cpus();
    assert_eq!(cpus.0, expected, "--pin-cores {last}");
    assert_eq!(
        cpus.1,
        Some(allowed),
        "--pin-cores none leaves the whole mask"
    );
    driver.stop_executors(DEADLINE).expect("stop");
    assert!(pinned.wait().expect("wait").success());
    assert!(free.wait().expect("wait").success());
}

#[test]
fn flint_local_gives_its_executors_distinct_cpus() {
    let allowed = allowed_cpus();
    if allowed.len() < 2 {
        println!("SKIPPED: one CPU in the affinity mask; nothing to spread over");
        return;
    }
    let driver = Arc::new(Driver::builder().start().expect("driver starts"));
    let addr = driver.local_addr().expect("listening");
    let mut config = LocalConfig::new(env!("CARGO_BIN_EXE_flint").into(), addr);
    config.pin_cpus = allowed.clone();
    config.allocator = AllocatorConfig {
        initial_target: 2,
        ..config.allocator
    };
    let executors = LocalExecutors::start(config, driver.clone()).expect("starts");
    driver
        .wait_for_executors(2, DEADLINE)
        .expect("both register");
    let me = std::process::id();
    let seen = || -> Vec<Vec<usize>> {
        (children_of(me).into_iter())
            .filter(|pid| cmdline(*pid).contains("local-"))
            .filter_map(task_thread_cpus)
            .collect()
    };
    wait_until_or(
        "two pinned executors",
        || {
            let seen = seen();
            seen.len() == 2 && seen.iter().all(|cpus| cpus.len() == 1)
        },
        || format!("{:?}", seen()),
    );
    let seen = seen();
    assert!(seen.iter().all(|cpus| cpus.len() == 1), "{seen:?}");
    assert_ne!(seen[0], seen[1], "each executor on its own CPU: {seen:?}");
    executors.freeze();
    let _ = driver.stop_executors(DEADLINE);
    executors.shutdown(DEADLINE);
}

/// A process's command line, arguments joined by spaces.
fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|bytes| String::from_utf8_lossy(&bytes).replace('\0', " "))
        .unwrap_or_default()
}

/// The pids whose parent is `parent` (other tests' children too: filter them).
fn children_of(parent: u32) -> Vec<u32> {
    let mut children = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        // pid (comm) state ppid ...: comm may hold spaces, so split after the last ')'.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(parent) {
            children.push(pid);
        }
    }
    children
}
