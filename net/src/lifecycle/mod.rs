//! Where a driver's executors come from and where they go, the IO side of the engine's
//! lifecycle state machines (`flint_engine::lifecycle`: the snapshot store, the allocator,
//! removals): [`local`] starts `flint executor` processes itself and keeps them at the
//! allocator's target; [`mirror`] follows executors a cluster manager creates, through an
//! [`mirror::ExecutorSource`]; [`master_source`] is that source for the standalone master's executors,
//! and scales them with the backlog.

pub mod local;
pub mod master_source;
pub mod mirror;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// A handler's thread, run until it is told to stop (by [`Background::halt`] or on drop): the
/// one shape of [`mirror::SourceMirror`] and [`master_source::MasterScaler`]. The body gets the
/// stop flag and checks it between rounds.
struct Background {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Background {
    fn spawn(
        name: &str,
        body: impl FnOnce(&AtomicBool) + Send + 'static,
    ) -> std::io::Result<Background> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || body(&flag))?;
        Ok(Background {
            stop,
            thread: Some(thread),
        })
    }

    /// Tells the body to stop and waits for its thread.
    fn halt(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        self.halt();
    }
}
