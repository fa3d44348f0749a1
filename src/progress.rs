//! Progress reporting, for every stage: the work tells a [`Progress`] how many bytes are done;
//! the binary decides whether that becomes a bar. A leaf module, so that resolve (downloads) and
//! execute (writes, loads) report the same way without importing each other.

/// Told how many output bytes are done, for progress bars.
pub trait Progress: Sync {
    fn advance(&self, bytes: u64);
}

/// No progress reporting.
pub struct Quiet;

impl Progress for Quiet {
    fn advance(&self, _: u64) {}
}
