//! Exit statuses, documented in README.md and `wload --help`. A leaf: every module's error says
//! which one it means (`exit_status()`), and the binary turns that into the process's status.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    Ok = 0,
    /// I/O, network or device failure.
    Runtime = 1,
    /// Bad command line.
    Usage = 2,
    /// The checkpoint is malformed or does not fit the model / plan.
    Checkpoint = 3,
    /// Stopped by SIGINT, SIGTERM or SIGHUP; nothing was published. The binary exits with 128 +
    /// the signal's number (130 for Ctrl-C).
    Interrupted = 130,
}

impl ExitStatus {
    /// The name `--json` error documents give this status (`error.kind`), documented with the
    /// codes in docs/json.md: a pipeline can branch on it without parsing messages.
    pub(crate) fn kind(self) -> &'static str {
        match self {
            ExitStatus::Ok => "ok",
            ExitStatus::Runtime => "runtime",
            ExitStatus::Usage => "usage",
            ExitStatus::Checkpoint => "checkpoint",
            ExitStatus::Interrupted => "interrupted",
        }
    }
}
