//! Progress reporting, for every stage: the work tells a [`Progress`] how many bytes are done;
//! the binary decides whether that becomes a bar. A leaf module, so that resolve (downloads) and
//! execute (writes, loads) report the same way without importing each other.

use std::fmt;
use std::sync::Arc;

/// Told how many output bytes are done, for progress bars.
pub trait Progress: Sync {
    fn advance(&self, bytes: u64);
}

/// No progress reporting.
pub struct Quiet;

impl Progress for Quiet {
    fn advance(&self, _: u64) {}
}

/// Makes the progress reporter for one download of a remote source, given the file name and its
/// size in bytes. The binary draws bars on a terminal; the default reports nothing.
#[derive(Clone, Default)]
pub struct DownloadProgress(Option<Arc<DownloadBar>>);

type DownloadBar = dyn Fn(&str, u64) -> Box<dyn Progress> + Send + Sync;

impl DownloadProgress {
    pub fn new(f: impl Fn(&str, u64) -> Box<dyn Progress> + Send + Sync + 'static) -> Self {
        DownloadProgress(Some(Arc::new(f)))
    }

    /// The reporter for one download.
    pub fn start(&self, file: &str, size: u64) -> Box<dyn Progress> {
        match &self.0 {
            Some(f) => f(file, size),
            None => Box::new(Quiet),
        }
    }
}

impl fmt::Debug for DownloadProgress {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "DownloadProgress(bars)"
        } else {
            "DownloadProgress(quiet)"
        })
    }
}
