//! Issue 11.11: every bad flag value is a clear error at parse time (exit 2) before anything is
//! allocated or waited for: values that used to panic, abort, allocate gigabytes, wait forever
//! or be silently accepted.

mod common;

use std::process::Output;

const U64_MAX: &str = "18446744073709551615";

fn flint(args: &[&str]) -> Output {
    common::run_flint(args)
}

#[test]
fn bad_values_exit_2_with_a_message_naming_the_flag() {
    let driver = ["driver", "--listen", "127.0.0.1:1", "--executors", "1"];
    let executor = ["executor", "--driver", "127.0.0.1:1"];
    let cases: Vec<(Vec<&str>, &str)> = vec![
        ([&driver[..], &["--wait-s", U64_MAX]].concat(), "--wait-s"),
        (
            [&executor[..], &["--connect-timeout-s", U64_MAX]].concat(),
            "--connect-timeout-s",
        ),
        (vec!["local", "--tasks", U64_MAX], "--tasks"),
        (vec!["local", "--payload", U64_MAX], "--payload"),
        (vec!["local", "--tasks", "5000000000"], "--tasks"),
        // Under each limit alone, over the bound on a job's payload bytes together.
        (
            vec!["local", "--tasks", "10000000", "--payload", "1000000"],
            "--payload",
        ),
        ([&executor[..], &["--cores", "20000"]].concat(), "--cores"),
        (vec!["driver", "--executors", "0"], "--executors"),
        (
            vec!["local", "--heartbeat-timeout-ms", "0"],
            "--heartbeat-timeout-ms",
        ),
        (vec!["local", "--task", "fail:nan"], "--task"),
        (vec!["local", "--task", "sleep:-1"], "--task"),
        (vec!["local", "--task", "nosuchfunction"], "--task"),
        ([&executor[..], &["--id", ""]].concat(), "--id"),
        ([&executor[..], &["--id", "../x"]].concat(), "--id"),
        (
            [&executor[..], &["--pin-cores", "1023"]].concat(),
            "--pin-cores",
        ),
        (
            [&executor[..], &["--pin-cores", "zero"]].concat(),
            "--pin-cores",
        ),
        (vec!["local", "--tasks-per-core", "0"], "--tasks-per-core"),
        // the old name is an alias: the value is checked as the new flag's
        (vec!["local", "--queue-depth", "0"], "--tasks-per-core"),
        (vec!["local", "--max-failures", "0"], "--max-failures"),
        (vec!["local", "--executors", "0"], "--executors"),
        (
            vec!["local", "--batch-delay-ms", U64_MAX],
            "--batch-delay-ms",
        ),
    ];
    for (args, flag) in cases {
        let output = flint(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "flint {args:?}: {stderr}");
        assert!(
            stderr.contains(flag),
            "flint {args:?} names {flag}: {stderr}"
        );
    }
}

#[test]
fn help_documents_the_ranges() {
    for (command, range) in [
        ("local", "(1 to 64)"),
        ("driver", "(1 to 86,400)"),
        ("executor", "(1 to 1024)"),
    ] {
        let output = flint(&[command, "--help"]);
        let help = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{help}");
        assert!(help.contains(range), "flint {command} --help: {help}");
    }
}
