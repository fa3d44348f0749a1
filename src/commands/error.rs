//! The library's error type and the exit status each error maps to. The commands' own failures
//! are here too (`load.rs`, `shard.rs`), below the commands that return them.

pub(crate) mod load;
pub(crate) mod shard;

use crate::checkpoint::HeaderError;
use crate::config::ConfigError;
use crate::exec::ExecError;
use crate::exec::device::DeviceError;
use crate::resolve::ResolveError;

pub(crate) use crate::exit::ExitStatus;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    #[error("{}", join_lines(.0))]
    Headers(Vec<HeaderError>),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Mapping(#[from] crate::mapping::MappingError),
    #[error(transparent)]
    Plan(#[from] crate::plan::PlanError),
    /// DeepSeek-V4: recognised, described, and refused (no verified reference).
    #[error(transparent)]
    PlatformSpecific(#[from] crate::model::deepseek_v4::PlatformSpecific),
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Shard(#[from] shard::ShardError),
    #[error(transparent)]
    Load(#[from] load::LoadError),
    #[error(transparent)]
    Ranks(#[from] crate::ranks::RankError),
    #[error("--filter: {0}")]
    BadFilter(#[from] regex::Error),
    #[error("writing output: {0}")]
    Output(#[source] std::io::Error),
}

impl From<crate::open::OpenError> for Error {
    fn from(e: crate::open::OpenError) -> Error {
        use crate::open::OpenError as O;
        match e {
            O::Resolve(e) => Error::Resolve(e),
            O::Headers(v) => Error::Headers(v),
            O::Config(e) => Error::Config(e),
            O::Usage(m) => Error::Usage(m),
        }
    }
}

impl From<crate::plan::pre_sharded::PreShardedError> for Error {
    fn from(e: crate::plan::pre_sharded::PreShardedError) -> Error {
        use crate::plan::pre_sharded::PreShardedError as P;
        match e {
            P::Plan(e) => Error::Plan(e),
            P::Headers(v) => Error::Headers(v),
            P::Ranks(e) => Error::Ranks(e),
            P::Mapping(e) => Error::Mapping(e),
        }
    }
}

impl Error {
    /// The message as printed for people: [`Display`](std::fmt::Display)'s text with every
    /// control character of the names, paths and strings in it escaped
    /// ([`crate::escape::escape`]), and a line break only where the message means one (between
    /// files' header errors, unreadable files, a plan's problems). A message is one line
    /// otherwise, so a name with a newline in it cannot print a line of its own. `--json`
    /// carries the `Display` text, exact.
    pub fn for_terminal(&self) -> String {
        use crate::escape::escape;
        match self {
            Error::Headers(v) => (v.iter())
                .map(|h| escape(&h.to_string()).into_owned())
                .collect::<Vec<_>>()
                .join("\nerror: "),
            Error::Resolve(e) => e.for_terminal(),
            Error::PlatformSpecific(e) => e.for_terminal(),
            Error::Plan(crate::plan::PlanError::Invalid(ps)) => {
                crate::problem::ProblemList(ps).for_terminal()
            }
            _ => escape(&self.to_string()).into_owned(),
        }
    }

    pub fn exit_status(&self) -> ExitStatus {
        match self {
            Error::Resolve(e) => e.exit_status(),
            // The most serious of the files' problems: one that cannot be read at all.
            Error::Headers(v) => v
                .iter()
                .map(HeaderError::exit_status)
                .find(|s| *s == ExitStatus::Runtime)
                .unwrap_or(ExitStatus::Checkpoint),
            Error::Config(e) => e.exit_status(),
            Error::BadFilter(_) | Error::Usage(_) => ExitStatus::Usage,
            Error::Mapping(e) => e.exit_status(),
            Error::Plan(e) => e.exit_status(),
            Error::PlatformSpecific(e) => e.exit_status(),
            Error::Output(_) => ExitStatus::Runtime,
            Error::Shard(e) => e.exit_status(),
            Error::Load(e) => e.exit_status(),
            Error::Ranks(_) => ExitStatus::Usage,
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

// The loader's device and engine failures, through `?` in `load`.
impl From<DeviceError> for Error {
    fn from(e: DeviceError) -> Error {
        Error::Load(e.into())
    }
}

impl From<ExecError> for Error {
    fn from(e: ExecError) -> Error {
        Error::Load(e.into())
    }
}
