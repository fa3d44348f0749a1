//! SIGINT, SIGTERM and SIGHUP (Ctrl-C, `timeout`, Slurm and CI cancellation, a closed terminal)
//! for the command: the first one asks long-running work to stop cleanly (nothing is published,
//! the staging folder is removed) and the process then exits 128 + the signal's number; a second
//! one ends the process at once (its staging folder is swept by the next run).
//!
//! The same under the Python console script: `wload._cli` first puts SIGINT back to its default
//! action, as a binary starts with, since Python's own handler only sets a flag that nothing
//! checks while this code runs (Ctrl-C would do nothing, then raise KeyboardInterrupt at the end).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

const SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

static STOP: AtomicBool = AtomicBool::new(false);
static WHICH: AtomicUsize = AtomicUsize::new(0);

/// The flag that long-running work polls.
pub(crate) fn flag() -> &'static AtomicBool {
    &STOP
}

/// Installs the handlers (once). Called only when the work that polls [`flag`] starts: before
/// that the signals keep their default action, which ends wload at once wherever it is (reading
/// headers, downloading, planning), with nothing of its own left to clean up.
pub(crate) fn install() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        for sig in SIGNALS {
            // The shutdown goes first, so that it fires only on a second signal.
            let _ = signal_hook::flag::register_conditional_shutdown(sig, 128 + sig, &STOP);
            let _ = signal_hook::flag::register_usize(sig, &WHICH, sig as usize);
            let _ = signal_hook::flag::register(sig, &STOP);
        }
    });
}

/// 128 + the number of the signal that stopped the work (130 if none was seen).
pub(crate) fn exit_status() -> u8 {
    match WHICH.load(Ordering::SeqCst) {
        0 => 130,
        n => u8::try_from(128 + n).unwrap_or(130),
    }
}
