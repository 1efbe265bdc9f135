//! The shared-secret flags, one group every command that meets a peer flattens in
//! (`driver`, `executor`, `master`, `worker`, `submit`, `status`; `flint local` makes a fresh
//! secret of its own), and how each kind of role gets its secret from them.

use std::path::PathBuf;

use clap::Args;
use flint_net::handshake::{Secret, SECRET_ENV};

/// `--secret-file`, `--insecure`, `--allow-insecure-bind`.
#[derive(Args, Clone, Default)]
pub struct SecretArgs {
    /// File holding the shared secret; else $FLINT_SECRET. `flint master` creates it (random,
    /// mode 0600) if it does not exist, and without it uses $FLINT_SECRET, STATE_DIR/secret or
    /// a new file in a fresh temporary directory, and prints where it is; workers, `flint
    /// submit` and `flint status` need that secret. `flint driver` and `flint executor` run
    /// without one when neither is given.
    #[arg(long, value_name = "PATH")]
    pub secret_file: Option<PathBuf>,
    /// Run without a shared secret (the peers must too): nothing authenticates them. For a
    /// master, anyone who can reach it can register workers and applications (and so run
    /// executors on the workers). Listening roles stay on loopback unless
    /// --allow-insecure-bind.
    #[arg(long)]
    pub insecure: bool,
    /// Without a shared secret: listen on a non-loopback address too (roles that listen:
    /// master, worker, driver, submit).
    #[arg(long)]
    pub allow_insecure_bind: bool,
}

impl SecretArgs {
    /// The secret of a role that may run without one (`flint driver`, `flint executor`):
    /// --secret-file, else $FLINT_SECRET, else none; none with --insecure.
    pub fn optional(&self) -> Result<Option<Secret>, String> {
        if self.insecure {
            self.check_insecure()?;
            return Ok(None);
        }
        self.load()
    }

    /// The secret a worker, `flint submit` or `flint status` proves to the master: required
    /// unless --insecure.
    pub fn required(&self, who: &str) -> Result<Option<Secret>, String> {
        if self.insecure {
            self.check_insecure()?;
            tracing::warn!("{who}: --insecure: no shared secret, nothing authenticates the master");
            return Ok(None);
        }
        match self.load()? {
            Some(secret) => Ok(Some(secret)),
            None => Err(format!(
                "no shared secret: pass --secret-file PATH (the file `flint master` printed when \
                 it started, e.g. STATE_DIR/secret) or set ${SECRET_ENV}; --insecure runs \
                 without one (the master must too)"
            )),
        }
    }

    /// Refuses --allow-insecure-bind for a role that listens nowhere (`who`).
    pub fn listens_nowhere(&self, who: &str) -> Result<(), String> {
        if self.allow_insecure_bind {
            return Err(format!(
                "--allow-insecure-bind: {who} listens nowhere, so it does not apply"
            ));
        }
        Ok(())
    }

    /// --insecure with --secret-file is a contradiction.
    pub fn check_insecure(&self) -> Result<(), String> {
        if self.secret_file.is_some() {
            return Err("--insecure and --secret-file exclude each other".into());
        }
        Ok(())
    }

    /// --secret-file, else $FLINT_SECRET, else none.
    fn load(&self) -> Result<Option<Secret>, String> {
        match &self.secret_file {
            Some(path) => Secret::from_file(path).map(Some),
            None => Secret::from_env(SECRET_ENV),
        }
        .map_err(|e| e.to_string())
    }
}
