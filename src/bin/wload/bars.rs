//! Progress bars for the binary: indicatif on a terminal, nothing otherwise.

use std::io::IsTerminal;

use std::time::Duration;

use indicatif::{HumanDuration, ProgressBar, ProgressState, ProgressStyle};
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
    pb.set_style(with_eta(
        "{prefix}{bar:40.cyan/blue} {bytes}/{total_bytes} {binary_bytes_per_sec} {eta}",
    ));
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
        pb.set_style(with_eta(
            "{bar:30.cyan/blue} {bytes}/{total_bytes} {binary_bytes_per_sec} {eta} {msg}",
        ));
        // The name is the hub's: a control character in it would reach the terminal raw.
        pb.set_message(format!("downloading {}", wload::Esc(file)));
        Box::new(Bar(pb))
    })
}

/// `template` with its `{eta}` drawn by [`eta_text`], not indicatif's own estimate.
fn with_eta(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template)
        .expect("valid template")
        .with_key("eta", |s: &ProgressState, w: &mut dyn std::fmt::Write| {
            let _ = w.write_str(&eta_text(s.elapsed(), s.pos(), s.len().unwrap_or(0)));
        })
}

/// The time left, from the average rate since the start: indicatif's recent-rate estimate swings
/// to hours in the first second of a run (the first chunks wait on opening files and on the
/// disk's queue). Nothing until a second has passed and 1% is done, when the average means
/// something.
fn eta_text(elapsed: Duration, pos: u64, len: u64) -> String {
    if elapsed < Duration::from_secs(1) || len == 0 || pos * 100 < len || pos >= len {
        return String::new();
    }
    let left = elapsed.as_secs_f64() * (len - pos) as f64 / pos as f64;
    format!(
        "ETA {}",
        HumanDuration(Duration::from_secs_f64(left.ceil()))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_eta_waits_for_a_second_and_follows_the_average_rate() {
        let s = Duration::from_secs;
        // The first second of a 3-8 s shard, whatever the first chunk's rate.
        assert_eq!(eta_text(Duration::from_millis(400), 1, 1000), "");
        assert_eq!(eta_text(s(2), 5, 1000), "", "under 1% done");
        // 2 s for a quarter: 6 s left, not a recent chunk's guess.
        assert_eq!(eta_text(s(2), 250, 1000), "ETA 6 seconds");
        assert_eq!(eta_text(s(30), 1000, 1000), "");
    }
}
