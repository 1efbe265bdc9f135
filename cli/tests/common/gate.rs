//! `Gate`: a job a test looks at while it runs lasts until the test releases it. The built-in
//! `gate:PATH` task waits until the file at `PATH` exists, then returns what `hash` returns (so
//! checksums still hold); a test makes a job of `gate.task()` tasks, puts its mid-job state in
//! place (executors holding attempts, a kill, a restart) for as long as that takes on any
//! machine, then calls `gate.open()`. Shared by flint-cli's process tests (`common`) and
//! flint-k8s's (`#[path]`), which run the same `flint executor`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A shut gate at a path of its own, in Cargo's scratch dir for integration tests
/// (`target/tmp`, outside any scratch dir a test removes). Opened when dropped, so nothing
/// waits on it after its test ends or fails; the empty file stays behind for the same reason (a
/// process still polling it must see it).
pub struct Gate {
    path: PathBuf,
}

impl Gate {
    pub fn new() -> Gate {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "flint-gate-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::create_dir_all(env!("CARGO_TARGET_TMPDIR"));
        let _ = std::fs::remove_file(&path);
        Gate { path }
    }

    /// The file whose existence opens the gate.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The task function held by this gate: `gate:PATH`.
    pub fn task(&self) -> String {
        format!("gate:{}", self.path.display())
    }

    /// Opens the gate: every task waiting on it goes on, and later ones do not wait.
    pub fn open(&self) {
        std::fs::write(&self.path, b"").expect("open the gate");
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.path, b"");
    }
}
