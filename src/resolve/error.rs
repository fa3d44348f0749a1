//! Why a SOURCE resolves to no checkpoint, and what to do about it: each refusal names the folder,
//! the files and the load format involved.

use std::path::{Path, PathBuf};

use super::local;

#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("{path}: no such file or directory")]
    NotFound { path: PathBuf },
    /// A SOURCE that is no existing path and is not taken for a hub repo id: shaped like a path
    /// (`./`, `../`, `/`, `~`, several `/`, a trailing `/`), or like `org/name` with a local
    /// folder of a close name beside where it points.
    #[error(
        "{path}: no such folder (no such file or directory){}{}",
        if *.hub_shaped { "; not asked of the hub as a repo id, since a local path of a close name exists" } else { "" },
        suggestion.as_ref().map_or_else(String::new, |s| format!("; did you mean {}?", s.display()))
    )]
    NoSuchFolder {
        path: PathBuf,
        /// The existing path closest to it, each missing component replaced by its nearest sibling.
        suggestion: Option<PathBuf>,
        /// It reads `org/name`, which would otherwise have been a hub repo id.
        hub_shaped: bool,
    },
    #[error("{path}: not a directory; SOURCE is a checkpoint folder{}", lone_file_hint(.path))]
    NotADirectory { path: PathBuf },
    #[error("{path}: cannot read: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{root}: cannot find any model weights (load format {format}, tried {patterns}){hint}",
        patterns = patterns.join(", ")
    )]
    NoWeights {
        root: PathBuf,
        format: &'static str,
        patterns: Vec<&'static str>,
        hint: String,
    },
    #[error(
        "{root}: the weights are {kind} files ({files}), which wload does not support yet; convert them to safetensors (e.g. with `safetensors.torch.save_file`)",
        files = files.join(", ")
    )]
    UnsupportedWeights {
        root: PathBuf,
        kind: &'static str,
        files: Vec<String>,
    },
    #[error("{index}: {message}")]
    BadIndex { index: PathBuf, message: String },
    #[error(
        "{index}: weight files referenced in index but missing: {missing}",
        missing = missing.join(", ")
    )]
    IndexMissingFiles {
        index: PathBuf,
        missing: Vec<String>,
    },
    #[error(
        "{index}: tensor '{tensor}' points to '{file}', outside the checkpoint folder; refusing to read it"
    )]
    IndexEscapes {
        index: PathBuf,
        tensor: String,
        file: String,
    },
    #[error(
        "{root}: no config.json{mistral}; vLLM needs the model's config to build it{params}",
        mistral = if *.mistral { " or params.json" } else { "" },
        params = if *.has_params { "; it has Mistral's params.json, which vLLM reads by itself only next to consolidated*.safetensors: pass --config-format mistral (to vllm serve too)" } else { "" }
    )]
    NoConfig {
        root: PathBuf,
        mistral: bool,
        /// params.json is there, unread under the config format in effect.
        has_params: bool,
    },
    #[error(
        "{root}: a pre-sharded folder (vLLM sharded_state files {pattern}, written for {written_for} per its {from}), not a checkpoint; plan and shard read checkpoints. Check it with `wload load {quoted} --dry-run`, serve it with `{serve}`; to shard for another TP or PP, run `wload shard` on the original checkpoint{original} (re-sharding rank files is not supported)",
        from = written_for.from,
        written_for = written_for.flags(),
        quoted = crate::sharded::serve::shell_quote(&root.display().to_string()),
        original = written_for.source_checkpoint.as_ref().map_or_else(String::new, |s| format!(" ({s}, per wload.json)"))
    )]
    PreSharded {
        root: PathBuf,
        pattern: &'static str,
        /// Boxed: every `Result` of the library carries a `ResolveError`.
        written_for: Box<crate::sharded::names::WrittenFor>,
        /// `vllm serve` for the folder, built by wload from its layout
        /// ([`crate::sharded::serve::serve_command`]).
        serve: String,
    },
    /// A remote source (a hub repo id) that could not be resolved or fetched: the remote's own
    /// error, behind [`RemoteFailure`] so that this type names no remote.
    #[error(transparent)]
    Remote(#[from] RemoteFailure),
    /// Names vLLM's glob selects (or the config it reads) that cannot be read as files (dangling
    /// links, folders, FIFOs, names that are not UTF-8): reported, one line each, not skipped.
    /// `why` says how vLLM comes to open them.
    #[error("{}", unreadable_lines(root, why, files))]
    UnreadableWeights {
        root: PathBuf,
        why: String,
        files: Vec<local::Unreadable>,
    },
}

/// What a remote source's error tells besides its message: the exit status it means.
pub trait RemoteError: std::error::Error + Send + Sync + 'static {
    fn exit_status(&self) -> crate::exit::ExitStatus;
}

/// A remote's error inside a [`ResolveError`]. Boxed behind [`RemoteError`] because the remote
/// sits above this file (it returns `ResolveError`s), so this file cannot name its type; each
/// remote converts its error with `From`.
#[derive(Debug)]
pub struct RemoteFailure(Box<dyn RemoteError>);

impl RemoteFailure {
    pub fn new(e: impl RemoteError) -> RemoteFailure {
        RemoteFailure(Box::new(e))
    }
}

impl std::fmt::Display for RemoteFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for RemoteFailure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

impl ResolveError {
    /// The message for a terminal: one line per unreadable file, else one line whole, every
    /// control character in it escaped ([`crate::escape::escape`]).
    pub fn for_terminal(&self) -> String {
        use crate::escape::escape;
        match self {
            ResolveError::UnreadableWeights { root, why, files } => {
                (unreadable_line_list(root, why, files).iter())
                    .map(|l| escape(l).into_owned())
                    .collect::<Vec<_>>()
                    .join("\nerror: ")
            }
            _ => escape(&self.to_string()).into_owned(),
        }
    }

    pub fn exit_status(&self) -> crate::exit::ExitStatus {
        use crate::exit::ExitStatus;
        match self {
            ResolveError::NotFound { .. }
            | ResolveError::NoSuchFolder { .. }
            | ResolveError::NotADirectory { .. } => ExitStatus::Usage,
            // An index past the small-file limit is the checkpoint's fault, like a malformed one.
            ResolveError::Io { source, .. } if crate::small_file::is_too_large(source) => {
                ExitStatus::Checkpoint
            }
            ResolveError::Io { .. } => ExitStatus::Runtime,
            ResolveError::Remote(e) => e.0.exit_status(),
            _ => ExitStatus::Checkpoint,
        }
    }
}

/// What to do with a lone safetensors file given as SOURCE: vLLM builds the model from a folder's
/// config, so only `inspect` reads the file alone.
fn lone_file_hint(path: &Path) -> String {
    if !path.to_string_lossy().ends_with(".safetensors") {
        return String::new();
    }
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let is_rank_file = path
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| crate::sharded::names::RankFile::parse(n).is_some());
    if is_rank_file {
        return format!(
            ", and this is one part of a pre-sharded folder: inspect or load the folder, {}",
            parent.display()
        );
    }
    let has_config = parent.join("config.json").is_file() || parent.join("params.json").is_file();
    let with_config = if has_config {
        format!(
            "pass the folder it is in, {}, which has the model's config",
            parent.display()
        )
    } else {
        "put it in a folder with the model's config.json (vLLM builds the model from it) and pass that folder".to_string()
    };
    format!(
        ", and a single .safetensors file has no config: {with_config}; `wload inspect {}` lists the file's tensors alone",
        crate::sharded::serve::shell_quote(&path.display().to_string())
    )
}

fn unreadable_lines(root: &Path, glob: &str, files: &[local::Unreadable]) -> String {
    unreadable_line_list(root, glob, files).join("\nerror: ")
}

/// One line per unreadable file, each a message of its own.
fn unreadable_line_list(root: &Path, glob: &str, files: &[local::Unreadable]) -> Vec<String> {
    files
        .iter()
        .map(|u| {
            let p = root.join(&u.name);
            let p = p.display();
            match &u.problem {
                local::Problem::Dangling { target } => format!(
                    "{p}: symbolic link to '{}', which does not exist (a Hugging Face cache whose blob is gone?); {glob} and then fails to open it: restore what it points to (download the model again) or remove the link",
                    target.display()
                ),
                local::Problem::BrokenLink { target, error } => format!(
                    "{p}: symbolic link to '{}' cannot be followed ({error}); {glob} and then fails to open it: fix or remove the link",
                    target.display()
                ),
                local::Problem::NotRegular { kind } => format!(
                    "{p}: is {kind}, not a regular file; {glob} and then fails to read it: rename or remove it"
                ),
                local::Problem::NotUtf8 { bytes } => format!(
                    "{p}: file name is not valid UTF-8 (bytes \"{bytes}\"); {glob}, since Python keeps undecodable bytes as surrogate escapes, but no index, report or manifest can name it: rename it to a UTF-8 name"
                ),
            }
        })
        .collect()
}
