//! Work that may wait on the network for hours (a hub download during `wload.plan`) runs on a
//! thread of its own while the calling thread waits without the GIL and checks Python's signals
//! every tenth of a second, so that Ctrl-C raises `KeyboardInterrupt` at once rather than when
//! the download ends.
//!
//! Unlike the engine's loop in `fill.rs`, which must wait for its thread (it writes into memory
//! the caller owns), planning writes nothing the caller holds: the stop flag makes a download end
//! at its next read, keeping what arrived for the next run, and a read the network holds up
//! (until `HF_HUB_DOWNLOAD_TIMEOUT`) is left to end by itself on its detached thread.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use pyo3::prelude::*;

/// How long an interrupted call waits for its work to stop before it raises anyway.
const GRACE: Duration = Duration::from_secs(1);

/// Runs `work` on its own thread and returns its result; on a Python signal that raises (Ctrl-C),
/// sets `stop`, gives the work [`GRACE`] to notice, and raises the signal's exception.
pub(crate) fn run<T: Send + 'static>(
    py: Python<'_>,
    stop: Arc<AtomicBool>,
    work: impl FnOnce() -> T + Send + 'static,
) -> PyResult<T> {
    let (tx, mut rx) = mpsc::channel();
    let thread = std::thread::Builder::new()
        .name("wload-plan".into())
        .spawn(move || {
            let _ = tx.send(work());
        })
        .map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(format!("wload: {e}")))?;
    loop {
        // The receiver travels into the GIL-free closure and back (it is Send, not Sync).
        let got;
        (rx, got) = py.detach(move || {
            let got = rx.recv_timeout(Duration::from_millis(100));
            (rx, got)
        });
        match got {
            Ok(r) => return Ok(r),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if let Err(e) = py.check_signals() {
                    stop.store(true, Ordering::Relaxed);
                    let _ = py.detach(move || rx.recv_timeout(GRACE));
                    return Err(e);
                }
            }
            // Only a panic ends the thread unsent: raised here as PyO3 raises any panic.
            Err(mpsc::RecvTimeoutError::Disconnected) => match thread.join() {
                Err(panic) => std::panic::resume_unwind(panic),
                Ok(()) => unreachable!("the thread sends before it ends"),
            },
        }
    }
}
