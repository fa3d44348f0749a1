//! What can go wrong with a hub source, worded with the repo, the file and what to do.

use std::fmt;
use std::io;
use std::path::PathBuf;

use super::HubRequest;
use super::http::{HttpError, Limit};

/// A hub repo id that could not be resolved or fetched.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error(
        "{repo}: repository not found on {endpoint} (or it has no revision '{revision}'); SOURCE is not a local folder either"
    )]
    NotFound {
        repo: String,
        revision: String,
        endpoint: String,
    },
    #[error(
        "{repo}: {endpoint} refused access{file} (HTTP {status}): the repo is gated or private (or does not exist); {hint}",
        file = file.as_ref().map_or_else(String::new, |f| format!(" to {f}")),
        hint = if *.token { "HF_TOKEN is set, but its token has no access to it (request access on the repo's page)" } else { "set HF_TOKEN to a token that has access" }
    )]
    Unauthorized {
        repo: String,
        endpoint: String,
        status: u16,
        file: Option<String>,
        token: bool,
    },
    #[error("{repo}: {file}: not found on {endpoint} at commit {commit}")]
    FileNotFound {
        repo: String,
        file: String,
        endpoint: String,
        commit: String,
    },
    #[error(
        "{repo}: no local folder of that name, and cannot reach {endpoint} to look it up as a Hugging Face repo id: {message}"
    )]
    Network {
        repo: String,
        endpoint: String,
        message: String,
    },
    #[error("{repo}: {endpoint} answered HTTP {status}{file}", file = file.as_ref().map_or_else(String::new, |f| format!(" for {f}")))]
    Http {
        repo: String,
        endpoint: String,
        status: u16,
        file: Option<String>,
    },
    #[error(
        "{repo}: {endpoint} sent nothing for {secs} s while asked for {what}; {var} sets this timeout in seconds (default 10): raise it if the hub is only slow",
        secs = limit.secs,
        var = limit.var
    )]
    MetadataTimeout {
        repo: String,
        endpoint: String,
        /// "the repo's file list", "the metadata of `file`".
        what: String,
        limit: Limit,
    },
    /// Boxed: the other variants are small, and every `Result` of the library carries one.
    #[error(transparent)]
    DownloadStalled(Box<Stalled>),
    #[error("{repo}: downloading {file}: {message}")]
    Download {
        repo: String,
        file: String,
        message: String,
    },
    #[error(
        "{repo}: no local folder of that name, and as a repo id (revision {revision}) it is not in the Hugging Face cache {cache}{why}"
    )]
    NotCached {
        repo: String,
        revision: String,
        cache: PathBuf,
        why: Why,
    },
    #[error(
        "{repo} (revision {revision}): not in the Hugging Face cache: {files} (looked in {snapshot}){why}",
        files = files.join(", ")
    )]
    FilesNotCached {
        repo: String,
        revision: String,
        snapshot: PathBuf,
        files: Vec<String>,
        why: Why,
    },
    /// Boxed, as `DownloadStalled`.
    #[error(transparent)]
    Redirect(Box<Redirected>),
    #[error(
        "{repo}: {endpoint}'s answer to the request for the repo's file list cannot be used: {message}"
    )]
    BadListing {
        repo: String,
        endpoint: String,
        message: String,
    },
    #[error(
        "{path}: holds '{content}', not a commit hash (40 hexadecimal digits, what huggingface_hub writes there); refusing to follow it: remove the file (the next online run writes it again){why}",
        content = super::url::shown(content)
    )]
    BadRef {
        path: PathBuf,
        content: String,
        why: Why,
    },
    #[error(
        "{path}: wload's saved file list of this commit cannot be read ({message}); remove it (an online run saves it again){why}"
    )]
    BadSavedListing {
        path: PathBuf,
        message: String,
        why: Why,
    },
    #[error(
        "{path}: wload's record of the headers kept for this commit cannot be read ({message}); remove it (an online run fetches the headers and writes it again){why}"
    )]
    BadHeaderRecord {
        path: PathBuf,
        message: String,
        why: Why,
    },
    #[error(
        "{path}: a link in the Hugging Face cache that leads to {target}, outside the repo's blobs and snapshots; refusing to read it: remove the link (an online run downloads the file again)"
    )]
    LinkEscapes { path: PathBuf, target: PathBuf },
    #[error(
        "{repo}: downloading {file} needs {size} bytes, and {dir} has {free} free; free some space or point HF_HUB_CACHE (or --download-dir) elsewhere"
    )]
    NoSpace {
        repo: String,
        file: String,
        size: u64,
        dir: PathBuf,
        free: u64,
    },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "{repo}: downloading {file}: stopped (interrupted){kept}",
        kept = kept.as_ref().map_or_else(String::new, |(have, size, part)| format!("; the {have} of {size} bytes that arrived are kept in {} and the next run resumes from there", part.display()))
    )]
    Stopped {
        repo: String,
        file: String,
        /// The partial file and how much of the file it holds, when one was begun.
        kept: Option<(u64, u64, PathBuf)>,
    },
}

impl HubError {
    /// Everything the hub answers, or fails to, is a runtime failure (exit 1): the command line
    /// was fine, the network or the repo's access was not. A download the caller stopped was
    /// interrupted (130).
    pub fn exit_status(&self) -> crate::exit::ExitStatus {
        match self {
            HubError::Stopped { .. } => crate::exit::ExitStatus::Interrupted,
            _ => crate::exit::ExitStatus::Runtime,
        }
    }
}

/// A transfer that stopped sending data, each time it was resumed.
#[derive(Debug, thiserror::Error)]
#[error(
    "{repo}: downloading {file} from {endpoint}: no data for {secs} s, {tries} tries in a row (each resumed where the last stopped); the {have} of {size} bytes that arrived are kept in {part} and the next run resumes from there. {var} sets this timeout in seconds (default 10): raise it if the link is only slow",
    secs = limit.secs,
    var = limit.var
)]
pub struct Stalled {
    pub(super) repo: String,
    pub(super) file: String,
    pub(super) endpoint: String,
    pub(super) limit: Limit,
    pub(super) tries: u32,
    pub(super) have: u64,
    pub(super) size: u64,
    pub(super) part: PathBuf,
}

/// A redirect wload does not follow.
#[derive(Debug, thiserror::Error)]
#[error(
    "{repo}: {endpoint} redirected {what} to '{location}', which wload does not follow: {why}",
    location = super::url::shown(location)
)]
pub struct Redirected {
    pub(super) repo: String,
    pub(super) endpoint: String,
    /// "the request for the repo's file list", "the request for `file`".
    pub(super) what: String,
    pub(super) location: String,
    pub(super) why: String,
}

/// Why the cache alone had to answer: the suffix of a not-cached error.
#[derive(Debug, Clone)]
pub enum Why {
    /// `HF_HUB_OFFLINE` is set.
    Offline,
    /// The hub could not be asked; its error.
    Unreachable(String),
}

impl fmt::Display for Why {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            Why::Offline => f.write_str(
                "; HF_HUB_OFFLINE is set, so nothing is downloaded (unset it to download the missing files)",
            ),
            Why::Unreachable(e) => write!(f, "; and the hub could not be asked: {e}"),
        }
    }
}

/// Words a failed request about `file` (or the repo itself). A stalled transfer is worded where
/// it is retried (`Fetcher::transfer`), which knows how far it got.
pub(super) fn http_error(
    req: &HubRequest,
    file: Option<&str>,
    commit: &str,
    e: HttpError,
) -> HubError {
    let repo = req.repo.to_string();
    let endpoint = req.env.endpoint.clone();
    let file_name = file.map(str::to_string);
    match e {
        HttpError::Status(status @ (401 | 403)) => HubError::Unauthorized {
            repo,
            endpoint,
            status,
            file: file_name,
            token: req.env.token.is_some(),
        },
        HttpError::Status(404) => match file {
            Some(f) => HubError::FileNotFound {
                repo,
                file: f.to_string(),
                endpoint,
                commit: commit.to_string(),
            },
            None => HubError::NotFound {
                repo,
                revision: req.revision.to_string(),
                endpoint,
            },
        },
        HttpError::Status(status) => HubError::Http {
            repo,
            endpoint,
            status,
            file: file_name,
        },
        HttpError::Timeout(limit) => HubError::MetadataTimeout {
            repo,
            endpoint,
            what: match file {
                Some(f) => format!("the metadata of {f}"),
                None => "the repo's file list".into(),
            },
            limit,
        },
        HttpError::Redirect { location, why } => HubError::Redirect(Box::new(Redirected {
            repo,
            endpoint,
            what: match file {
                Some(f) => format!("the request for {f}"),
                None => "the request for the repo's file list".into(),
            },
            location,
            why,
        })),
        HttpError::Stopped => HubError::Stopped {
            repo,
            file: file_name.unwrap_or_else(|| "the repo's file list".into()),
            kept: None,
        },
        HttpError::Invalid(message) if file.is_none() => HubError::BadListing {
            repo,
            endpoint,
            message,
        },
        // Not an HTTP status: the file's download, or reaching the hub at all.
        HttpError::Transport(message) | HttpError::Invalid(message) => match file {
            Some(f) => HubError::Download {
                repo,
                file: f.to_string(),
                message,
            },
            None => HubError::Network {
                repo,
                endpoint,
                message,
            },
        },
        HttpError::Local(path, source) => HubError::Io { path, source },
    }
}

impl crate::resolve::RemoteError for HubError {
    fn exit_status(&self) -> crate::exit::ExitStatus {
        HubError::exit_status(self)
    }
}

impl From<HubError> for crate::resolve::ResolveError {
    fn from(e: HubError) -> Self {
        crate::resolve::ResolveError::Remote(crate::resolve::RemoteFailure::new(e))
    }
}
