//! The library's error type and the exit status each error maps to.

use crate::checkpoint::HeaderError;
use crate::config::ConfigError;
use crate::source::SourceError;

/// Exit statuses, documented in README.md and `wload --help`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    Ok = 0,
    /// I/O or device failure.
    Runtime = 1,
    /// Bad command line.
    Usage = 2,
    /// The checkpoint is malformed or does not fit the model / plan.
    Checkpoint = 3,
    /// Interrupted by Ctrl-C (SIGINT); nothing was published.
    Interrupted = 130,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error("{}", join_lines(.0))]
    Headers(Vec<HeaderError>),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Mapping(#[from] crate::mapping::MappingError),
    #[error(transparent)]
    Plan(#[from] crate::plan::PlanError),
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Shard(#[from] crate::shard::ShardError),
    #[error(transparent)]
    Load(crate::load::LoadError),
    #[error("--filter: {0}")]
    BadFilter(#[from] regex::Error),
    #[error("writing output: {0}")]
    Output(#[source] std::io::Error),
}

impl Error {
    pub fn exit_status(&self) -> ExitStatus {
        match self {
            Error::Source(SourceError::NotFound { .. } | SourceError::NotADirectory { .. }) => {
                ExitStatus::Usage
            }
            Error::Source(SourceError::Io { .. } | SourceError::Hub(_)) => ExitStatus::Runtime,
            Error::Source(_) => ExitStatus::Checkpoint,
            Error::Headers(v) if v.iter().any(|e| matches!(e, HeaderError::Io { .. })) => {
                ExitStatus::Runtime
            }
            Error::Headers(_) => ExitStatus::Checkpoint,
            Error::Config(ConfigError::Io { .. }) => ExitStatus::Runtime,
            Error::Config(e) if e.is_usage() => ExitStatus::Usage,
            Error::Config(_) => ExitStatus::Checkpoint,
            Error::BadFilter(_) | Error::Usage(_) => ExitStatus::Usage,
            Error::Mapping(e) if e.is_usage() => ExitStatus::Usage,
            Error::Mapping(_) => ExitStatus::Checkpoint,
            Error::Plan(crate::plan::PlanError::BadTp) => ExitStatus::Usage,
            Error::Plan(crate::plan::PlanError::Mapping(e)) if e.is_usage() => ExitStatus::Usage,
            Error::Plan(_) => ExitStatus::Checkpoint,
            Error::Output(_) => ExitStatus::Runtime,
            Error::Shard(e) => e.exit_status(),
            Error::Load(
                crate::load::LoadError::BadRank(_) | crate::load::LoadError::Launcher(_),
            ) => ExitStatus::Usage,
            Error::Load(crate::load::LoadError::Exec(crate::exec::ExecError::Cancelled)) => {
                ExitStatus::Interrupted
            }
            Error::Load(crate::load::LoadError::Exec(crate::exec::ExecError::Corrupt {
                ..
            })) => ExitStatus::Checkpoint,
            Error::Load(_) => ExitStatus::Runtime,
        }
    }

    /// A closed pipe on stdout (`wload inspect … | head`) is not a failure.
    pub fn is_broken_pipe(&self) -> bool {
        matches!(self, Error::Output(e) if e.kind() == std::io::ErrorKind::BrokenPipe)
    }
}

fn join_lines<T: std::fmt::Display>(items: &[T]) -> String {
    items
        .iter()
        .map(T::to_string)
        .collect::<Vec<_>>()
        .join("\nerror: ")
}
