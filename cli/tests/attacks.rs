//! Issue 25, attackers and careless operators against a standalone cluster of real processes:
//! an application's environment that would run its own code on a worker, a fake master or
//! worker without the secret (raw sockets), a damaged or shared journal, files that are not
//! files, a poison task under `flint submit`.

mod common;

use common::cluster::*;
use common::{free_port, wait_until, DEADLINE};

use std::path::Path;
use std::process::Command;

use flint_engine::standalone::AppSpec;

/// Builds a shared library whose constructor creates `marker`; `None` (and a SKIPPED line)
/// without a C compiler.
fn preload_library(dir: &Path, marker: &Path) -> Option<std::path::PathBuf> {
    let source = dir.join("pwn.c");
    let library = dir.join("libpwn.so");
    std::fs::write(
        &source,
        format!(
            "#include <stdio.h>\n\
             __attribute__((constructor)) static void pwn(void) {{\n\
             FILE *f = fopen(\"{}\", \"w\"); if (f) {{ fputs(\"ran\", f); fclose(f); }}\n\
             }}\n",
            marker.display()
        ),
    )
    .expect("write pwn.c");
    let built = Command::new("gcc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&library)
        .arg(&source)
        .status();
    match built {
        Ok(status) if status.success() => Some(library),
        other => {
            println!("SKIPPED preload: no working gcc ({other:?})");
            None
        }
    }
}

/// Issue 25, item 1: an application (holding the secret) that sets `LD_PRELOAD` and other
/// loader variables for its executors: the library never runs, the loader variables never
/// reach the executor, the application's own `FLINT_APP_*` variables do, and the worker names
/// what it dropped. (On 66efba5 the library's constructor ran in the executor.)
#[test]
fn an_applications_loader_variables_never_reach_its_executors() {
    let dir = scratch("preload");
    let marker = dir.join("preload-ran");
    let Some(library) = preload_library(&dir, &marker) else {
        return;
    };
    let port = free_port();
    let _master = start_master(&dir, port, &[]);
    let worker = start_worker_allowing(&dir, port, "w1", "127.0.0.2", 1, &["/bin/sh"]);
    wait_status(port, "the worker", |s| s.alive_workers() == 1);
    let seen = dir.join("env.txt");
    let script = format!("env > {0}.tmp && mv {0}.tmp {0}", seen.display());
    let library = library.to_string_lossy().into_owned();
    let spec = AppSpec {
        name: "preload".into(),
        driver_addr: "127.0.0.1:1".into(),
        command: "/bin/sh".into(),
        args: vec!["-c".into(), script],
        env: vec![
            ("LD_PRELOAD".into(), library.clone()),
            ("LD_LIBRARY_PATH".into(), "/app-chose-this".into()),
            ("LD_AUDIT".into(), library),
            ("GCONV_PATH".into(), "/app-chose-this".into()),
            ("FLINT_APP_GREETING".into(), "hello".into()),
            ("RUST_LOG".into(), "debug".into()),
        ],
        cores_per_executor: 1,
        max_cores: 1,
        ..AppSpec::default()
    };
    let client = app_client(port, spec, 1);
    wait_until("the executor to write its environment", || seen.exists());
    let env = std::fs::read_to_string(&seen).expect("env.txt");
    assert!(
        !marker.exists(),
        "the application's preload library ran in its executor"
    );
    assert!(env.contains("FLINT_APP_GREETING=hello"), "{env}");
    assert!(env.contains("RUST_LOG=debug"), "{env}");
    // (The worker's own environment, which cargo gives an LD_LIBRARY_PATH, is the
    // operator's and still passes.)
    assert!(!env.contains("LD_PRELOAD="), "{env}");
    assert!(!env.contains("LD_AUDIT="), "{env}");
    assert!(!env.contains("/app-chose-this"), "{env}");
    for name in ["LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "GCONV_PATH"] {
        assert!(worker.stderr().contains(name), "{}", worker.stderr());
    }
    client.stop(DEADLINE);
    let _ = std::fs::remove_dir_all(&dir);
}
