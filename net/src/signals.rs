//! A daemon's stop on SIGTERM or SIGINT: what systemd and Kubernetes send to stop a service, and
//! Ctrl-C. Without it the default action ends the process at once and its clean-up never runs:
//! a worker's executors live on as orphans, a generated observe-token directory stays in /tmp.
//!
//! The handler only writes the signal's number to a pipe (`write` is async-signal-safe); a
//! thread blocked on the pipe's other end calls the role's stop once. A second signal while the
//! role stops ends the process at once with 128 + its number, as a shell reports a death by
//! signal, so an operator who asks twice is never kept waiting. One role per process: a second
//! [`on_stop_signal`] is refused.
//!
//! The executor has its own SIGTERM drain (`executor/drain.rs`), which leaves SIGINT alone.

use std::io;
use std::sync::atomic::{AtomicI32, Ordering};

/// The write end of the pipe the handler writes to; -1 until [`on_stop_signal`] installs it.
static PIPE_WRITE: AtomicI32 = AtomicI32::new(-1);

/// The signals that stop a daemon.
const STOP_SIGNALS: [libc::c_int; 2] = [libc::SIGTERM, libc::SIGINT];

extern "C" fn on_signal(signal: libc::c_int) {
    let fd = PIPE_WRITE.load(Ordering::SeqCst);
    if fd >= 0 {
        // Signal numbers fit in a byte (at most 64 on Linux).
        let byte = signal as u8;
        // SAFETY: `write` is async-signal-safe; `byte` lives across the call and is one byte
        // long. A full pipe (many signals unread) drops the byte: the first is what counts.
        unsafe { libc::write(fd, std::ptr::from_ref(&byte).cast(), 1) };
    }
}

/// The name a log line gives a signal.
pub fn signal_name(signal: i32) -> &'static str {
    match signal {
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        _ => "a signal",
    }
}

/// Calls `stop` (with the signal's number) on a thread of its own the first time the process
/// gets SIGTERM or SIGINT; a second one ends the process with 128 + its number. `role` names
/// the thread and the log lines. Once per process.
pub fn on_stop_signal(role: &str, stop: impl FnOnce(i32) + Send + 'static) -> io::Result<()> {
    let mut fds = [-1; 2];
    // SAFETY: `fds` has room for the two descriptors `pipe2` writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let [read_fd, write_fd] = fds;
    if PIPE_WRITE
        .compare_exchange(-1, write_fd, Ordering::SeqCst, Ordering::SeqCst)
        .is_err()
    {
        close_both(read_fd, write_fd);
        return Err(io::Error::other("a stop on SIGTERM is set already"));
    }
    for signal in STOP_SIGNALS {
        install(signal)?;
    }
    let role = role.to_owned();
    std::thread::Builder::new()
        .name("flint-stop-signal".into())
        .spawn(move || {
            let first = read_signal(read_fd);
            tracing::info!("{role}: {}: stopping", signal_name(first));
            let second = std::thread::Builder::new()
                .name("flint-stop-again".into())
                .spawn(move || {
                    let signal = read_signal(read_fd);
                    tracing::warn!("{}: asked twice, leaving at once", signal_name(signal));
                    std::process::exit(128 + signal);
                });
            if let Err(error) = second {
                tracing::warn!("no watch for a second signal: {error}");
            }
            stop(first);
        })
        .map(drop)
}

/// Installs [`on_signal`] for `signal`.
fn install(signal: libc::c_int) -> io::Result<()> {
    // SAFETY: the handler only loads an atomic and calls `write`, both async-signal-safe;
    // `action` is zeroed (a valid `sigaction`) with an emptied mask, outlives the call, which
    // copies it; the old action is not asked for (null). SA_RESTART keeps other threads'
    // blocking calls from failing with EINTR.
    let installed = unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        action.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(signal, &action, std::ptr::null_mut())
    };
    if installed != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Blocks until the handler writes a signal's number to `fd`.
fn read_signal(fd: libc::c_int) -> i32 {
    loop {
        let mut byte = 0u8;
        // SAFETY: `byte` is one writable byte that outlives the call.
        let read = unsafe { libc::read(fd, std::ptr::from_mut(&mut byte).cast(), 1) };
        if read == 1 {
            return i32::from(byte);
        }
        let error = io::Error::last_os_error();
        if read == 0 || error.kind() != io::ErrorKind::Interrupted {
            // The write end is never closed once installed; a failing pipe leaves the
            // process as a signal would have.
            tracing::error!("the stop signal's pipe failed: {error}");
            return libc::SIGTERM;
        }
    }
}

fn close_both(a: libc::c_int, b: libc::c_int) {
    // SAFETY: both are descriptors this module just opened and nothing else holds.
    unsafe {
        libc::close(a);
        libc::close(b);
    }
}
