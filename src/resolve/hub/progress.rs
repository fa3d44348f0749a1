//! Download progress: the caller's bars, fed the most of each file that has arrived.

use crate::progress::{DownloadProgress, Progress};

/// A download's progress bar, made when the first try starts, showing the most of the file that
/// has arrived: resumed bytes count once, and bytes fetched again after a restart do not count.
pub(super) struct Shown<'a> {
    make: &'a DownloadProgress,
    file: &'a str,
    bar: Option<Box<dyn Progress>>,
    shown: u64,
}

impl<'a> Shown<'a> {
    pub(super) fn new(make: &'a DownloadProgress, file: &'a str) -> Self {
        Shown {
            make,
            file,
            bar: None,
            shown: 0,
        }
    }

    /// `have` of the file's `size` bytes are in its partial file now.
    pub(super) fn show(&mut self, size: u64, have: u64) {
        let bar = self
            .bar
            .get_or_insert_with(|| self.make.start(self.file, size));
        if have > self.shown {
            bar.advance(have - self.shown);
            self.shown = have;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::Ordering;

    use super::*;

    #[test]
    fn progress_shows_the_most_that_arrived_once() {
        use std::sync::atomic::AtomicU64;
        struct Count(Arc<AtomicU64>);
        impl Progress for Count {
            fn advance(&self, n: u64) {
                self.0.fetch_add(n, Ordering::Relaxed);
            }
        }
        let total = Arc::new(AtomicU64::new(0));
        let t = total.clone();
        let make = DownloadProgress::new(move |_, _| Box::new(Count(t.clone())));
        let mut bar = Shown::new(&make, "f");
        bar.show(100, 40); // resumed at 40
        bar.show(100, 50);
        bar.show(100, 0); // the server ignored the Range: from the start again
        bar.show(100, 30);
        assert_eq!(total.load(Ordering::Relaxed), 50);
        bar.show(100, 100);
        assert_eq!(total.load(Ordering::Relaxed), 100);
    }
}
