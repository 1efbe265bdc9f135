//! A `flint` process with its output in files, killed on drop, and a scratch directory per
//! test: for the process tests that start several roles and read what they print.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{unique, DEADLINE};

const FLINT: &str = env!("CARGO_BIN_EXE_flint");

/// A fresh directory for one test's files.
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "flint-obs-{}-{name}-{}",
        std::process::id(),
        unique()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// A `flint` process with its output in files; killed on drop.
pub struct Proc {
    name: String,
    child: Child,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl Proc {
    /// Starts `flint ARGS` with `FLINT_SECRET` set to `secret` and `env` added.
    pub fn start(
        dir: &Path,
        name: &str,
        secret: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Proc {
        let stdout = dir.join(format!("{name}.out"));
        let stderr = dir.join(format!("{name}.err"));
        let mut command = Command::new(FLINT);
        command.env("FLINT_SECRET", secret);
        for (k, v) in env {
            command.env(k, v);
        }
        let child = command
            .args(args)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout).expect("stdout file"))
            .stderr(std::fs::File::create(&stderr).expect("stderr file"))
            .spawn()
            .expect("spawn flint");
        Proc {
            name: name.into(),
            child,
            stdout,
            stderr,
        }
    }

    pub fn stdout(&self) -> String {
        std::fs::read_to_string(&self.stdout).unwrap_or_default()
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    pub fn wait_exit(&mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + DEADLINE;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not exit: {}",
                self.name,
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proc {
    /// The observe token the process printed the file of.
    pub fn observe_token(&self) -> String {
        super::wait_observe_token(|| self.stderr())
    }
}
