//! What can be wrong with a safetensors file, in words that name the file, the tensor and the fix.

use crate::problem::Problem;
use std::path::PathBuf;

use super::MAX_HEADER_LEN;
use crate::dtype::{self, Dtype};

/// What is wrong with a safetensors file. Every variant names the file; those about one tensor name
/// it too.
#[derive(Debug, thiserror::Error)]
pub enum HeaderError {
    #[error("{path}: cannot read: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file exists but cannot be opened as a regular file: the checkpoint's fault as vLLM
    /// would meet it, not a transient I/O failure.
    #[error("{path}: {problem}; vLLM would fail to open it too: {fix}")]
    Unreadable {
        path: PathBuf,
        problem: String,
        fix: &'static str,
    },
    /// Tensor data asked of a file whose header alone was fetched from the hub.
    #[error(
        "{path}: only the header of this file was fetched from the hub, so its tensor data cannot be read; run a command that downloads it (`shard`, `load`, `load --dry-run --read`)"
    )]
    HeaderOnly { path: PathBuf },
    #[error("{path}: file is empty; a safetensors file starts with an 8-byte header length")]
    Empty { path: PathBuf },
    #[error(
        "{path}: file is {size} bytes, too short for the 8-byte header length of a safetensors file"
    )]
    TooShort { path: PathBuf, size: u64 },
    #[error(
        "{path}: header length {len} runs past the end of the file ({size} bytes); the file is truncated or not safetensors"
    )]
    HeaderPastEnd { path: PathBuf, len: u64, size: u64 },
    #[error("{path}: header length {len} exceeds the {MAX_HEADER_LEN}-byte limit of safetensors")]
    HeaderTooLarge { path: PathBuf, len: u64 },
    #[error(
        "{path}: header lists {count} tensors, more than the {limit} wload reads from one file \
         (the largest real checkpoints have tens of thousands in a file); the header is corrupt \
         or not a model's"
    )]
    TooManyTensors {
        path: PathBuf,
        count: usize,
        limit: usize,
    },
    #[error(
        "{root}: the checkpoint's {count} tensors are more than the {limit} wload reads from one \
         checkpoint (the largest real ones have about 250,000); check that the folder holds one \
         model's files"
    )]
    TooManyTensorsInCheckpoint {
        root: PathBuf,
        count: usize,
        limit: usize,
    },
    #[error("{path}: header is not valid UTF-8 (invalid byte at header offset {at})")]
    NotUtf8 { path: PathBuf, at: usize },
    #[error("{path}: header is not valid safetensors JSON: {message}")]
    BadJson { path: PathBuf, message: String },
    /// The `safetensors` crate refused the header for a reason wload's own checks do not name.
    #[error(
        "{path}: the safetensors library refuses the header ({reason}); vLLM could not load it either: re-download or re-export the file"
    )]
    Refused { path: PathBuf, reason: String },
    #[error("{path}: tensor '{tensor}' has unknown dtype '{dtype}' (known: {known})", known = dtype::known_names())]
    UnknownDtype {
        path: PathBuf,
        tensor: String,
        dtype: String,
    },
    #[error("{path}: tensor '{tensor}' has data_offsets [{start}, {end}] with end before start")]
    ReversedOffsets {
        path: PathBuf,
        tensor: String,
        start: u64,
        end: u64,
    },
    #[error(
        "{path}: tensor '{tensor}' shape {shape:?} of {dtype} needs {expected}, but its data_offsets span {found}"
    )]
    SizeMismatch {
        path: PathBuf,
        tensor: String,
        dtype: Dtype,
        shape: Vec<u64>,
        /// With its unit: "256 bytes", or why no byte count fits.
        expected: String,
        found: u64,
    },
    #[error(
        "{path}: tensors '{first}' [{first_start}, {first_end}) and '{second}' [{second_start}, {second_end}) overlap"
    )]
    Overlap {
        path: PathBuf,
        first: String,
        first_start: u64,
        first_end: u64,
        second: String,
        second_start: u64,
        second_end: u64,
    },
    #[error(
        "{path}: {gap} unused bytes before tensor '{tensor}' (data offset {at}); safetensors requires tensors to be packed without gaps"
    )]
    Gap {
        path: PathBuf,
        tensor: String,
        at: u64,
        gap: u64,
    },
    #[error(
        "{path}: tensor '{tensor}' ends at data offset {end}, past the end of the data region ({data_len} bytes): the file is truncated"
    )]
    PastEnd {
        path: PathBuf,
        tensor: String,
        end: u64,
        data_len: u64,
    },
    #[error(
        "{path}: data region is {data_len} bytes but the tensors cover only {covered}; the file has trailing bytes"
    )]
    TrailingBytes {
        path: PathBuf,
        covered: u64,
        data_len: u64,
    },
}

impl HeaderError {
    /// A file that cannot be read is a runtime failure; one that reads but is malformed is the
    /// checkpoint's.
    pub fn exit_status(&self) -> crate::exit::ExitStatus {
        match self {
            HeaderError::Io { .. } | HeaderError::HeaderOnly { .. } => {
                crate::exit::ExitStatus::Runtime
            }
            _ => crate::exit::ExitStatus::Checkpoint,
        }
    }
}

/// A malformed weight file as a problem: its file, and the tensor and shape it names. A header
/// error carries no fix of its own: its message says what is wrong, and the caller knows what to
/// do about it (re-download, copy again), if anything.
impl From<&HeaderError> for Problem {
    fn from(e: &HeaderError) -> Problem {
        use HeaderError as H;
        let (path, tensor, shape) = match e {
            H::Io { path, .. }
            | H::Unreadable { path, .. }
            | H::Empty { path }
            | H::HeaderOnly { path }
            | H::TooShort { path, .. }
            | H::HeaderPastEnd { path, .. }
            | H::HeaderTooLarge { path, .. }
            | H::NotUtf8 { path, .. }
            | H::BadJson { path, .. }
            | H::Refused { path, .. }
            | H::TrailingBytes { path, .. }
            | H::TooManyTensors { path, .. }
            | H::TooManyTensorsInCheckpoint { root: path, .. } => (path, None, None),
            H::UnknownDtype { path, tensor, .. }
            | H::ReversedOffsets { path, tensor, .. }
            | H::Gap { path, tensor, .. }
            | H::PastEnd { path, tensor, .. } => (path, Some(tensor), None),
            // Of two overlapping tensors, the one placed first; the message names both.
            H::Overlap { path, first, .. } => (path, Some(first), None),
            H::SizeMismatch {
                path,
                tensor,
                shape,
                ..
            } => (path, Some(tensor), Some(shape)),
        };
        Problem {
            message: e.to_string(),
            file: Some(path.display().to_string()),
            tensor: tensor.cloned(),
            shape: shape.cloned(),
            ..Problem::default()
        }
    }
}
