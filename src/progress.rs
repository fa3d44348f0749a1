//! Progress reporting, for every stage: the work tells a [`Progress`] how many bytes are done;
//! the binary decides whether that becomes a bar. A leaf module, so that resolve (downloads) and
//! execute (writes, loads) report the same way without importing each other.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Told how many output bytes are done, for progress bars.
pub trait Progress: Sync {
    fn advance(&self, bytes: u64);
}

/// No progress reporting.
pub struct Quiet;

impl Progress for Quiet {
    fn advance(&self, _: u64) {}
}

/// The caller's hold on a download of a remote source: makes the progress reporter for each
/// file (given its name and size in bytes) and holds the flag that stops downloads (the Python
/// package's Ctrl-C; the binary's default signal action already ends the process). The binary
/// draws bars on a terminal; the default reports nothing and is never stopped.
#[derive(Clone, Default)]
pub struct DownloadProgress {
    bars: Option<Arc<DownloadBar>>,
    stop: Option<Arc<AtomicBool>>,
}

type DownloadBar = dyn Fn(&str, u64) -> Box<dyn Progress> + Send + Sync;

impl DownloadProgress {
    pub fn new(f: impl Fn(&str, u64) -> Box<dyn Progress> + Send + Sync + 'static) -> Self {
        DownloadProgress {
            bars: Some(Arc::new(f)),
            stop: None,
        }
    }

    /// Downloads stop, between two reads of the network, once `flag` is set: what arrived stays
    /// in the partial file for the next run to resume.
    pub fn stopped_by(self, flag: Arc<AtomicBool>) -> Self {
        DownloadProgress {
            stop: Some(flag),
            ..self
        }
    }

    /// Whether the caller asked the downloads to stop.
    pub(crate) fn stopped(&self) -> bool {
        self.stop
            .as_ref()
            .is_some_and(|f| f.load(Ordering::Relaxed))
    }

    /// The reporter for one download.
    pub(crate) fn start(&self, file: &str, size: u64) -> Box<dyn Progress> {
        match &self.bars {
            Some(f) => f(file, size),
            None => Box::new(Quiet),
        }
    }
}

impl fmt::Debug for DownloadProgress {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(if self.bars.is_some() {
            "DownloadProgress(bars)"
        } else {
            "DownloadProgress(quiet)"
        })
    }
}
