//! A command that runs a job (`flint local`, `driver`, `submit`, `flint-k8s submit`) stopped by
//! SIGTERM or SIGINT.

use std::process::ExitCode;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;

/// A command that runs a job ends on SIGTERM or SIGINT as it does on any other failure: its job
/// is cancelled (`reason` is the job's abort), its executors stopped and its servers, with a
/// generated observe token's directory, dropped; then it exits with 128 + the signal's number,
/// as a shell reports a death by signal. A second signal leaves at once
/// (`flint_net::signals`).
#[derive(Debug)]
pub struct Stop(Arc<AtomicI32>);

impl Stop {
    /// Catches the signals for `command` (once per process, before the job starts).
    pub fn catch(command: &str) -> Result<Stop, String> {
        let signal = Arc::new(AtomicI32::new(0));
        let set = signal.clone();
        let name = command.to_owned();
        let stop = move |s| {
            let signal_name = flint_net::signals::signal_name(s);
            eprintln!("{name}: {signal_name}: cancelling the job (again to leave at once)");
            set.store(s, Ordering::SeqCst);
        };
        flint_net::signals::on_stop_signal(command, stop)
            .map_err(|e| format!("cannot catch SIGTERM: {e}"))?;
        Ok(Stop(signal))
    }

    /// The signal that came, if one did.
    fn signal(&self) -> Option<i32> {
        Some(self.0.load(Ordering::SeqCst)).filter(|&signal| signal != 0)
    }

    /// Why the job must end, once a signal came.
    pub fn reason(&self) -> Option<String> {
        let signal = self.signal()?;
        Some(format!(
            "{}: the job was cancelled",
            flint_net::signals::signal_name(signal)
        ))
    }

    /// Once a signal came: says why on stderr and gives the exit code.
    pub fn exit(&self, command: &str) -> Option<ExitCode> {
        let (signal, reason) = (self.signal()?, self.reason()?);
        eprintln!("{command}: {reason}");
        Some(ExitCode::from(
            u8::try_from(128 + signal).unwrap_or(u8::MAX),
        ))
    }
}
