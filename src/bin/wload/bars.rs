//! Progress bars for the binary: indicatif on a terminal, nothing otherwise.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};
use wload::{Progress, Quiet};

struct Bar(ProgressBar);

impl Progress for Bar {
    fn advance(&self, bytes: u64) {
        self.0.inc(bytes);
    }
}

impl Drop for Bar {
    fn drop(&mut self) {
        self.0.finish_and_clear();
    }
}

/// A byte-count bar with rate and ETA when stderr is a terminal and not `--quiet`, behind a word
/// saying what it counts ("writing", "loading").
pub(crate) fn labelled_bar(total: u64, quiet: bool, label: &str) -> Box<dyn Progress> {
    if quiet || !std::io::stderr().is_terminal() {
        return Box::new(Quiet);
    }
    let pb = ProgressBar::new(total);
    pb.set_style(
        ProgressStyle::with_template(
            "{prefix}{bar:40.cyan/blue} {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}",
        )
        .expect("valid template"),
    );
    if !label.is_empty() {
        pb.set_prefix(format!("{label} "));
    }
    Box::new(Bar(pb))
}

/// One bar per file download, stacked while several run at once, when stderr is a terminal and
/// not `--quiet`.
pub(crate) fn download_bars(quiet: bool) -> wload::DownloadProgress {
    if quiet || !std::io::stderr().is_terminal() {
        return Default::default();
    }
    let bars = indicatif::MultiProgress::new();
    wload::DownloadProgress::new(move |file, size| {
        let pb = bars.add(ProgressBar::new(size));
        pb.set_style(
            ProgressStyle::with_template(
                "{bar:30.cyan/blue} {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta} {msg}",
            )
            .expect("valid template"),
        );
        // The name is the hub's: a control character in it would reach the terminal raw.
        pb.set_message(format!("downloading {}", wload::Esc(file)));
        Box::new(Bar(pb))
    })
}
