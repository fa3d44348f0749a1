//! The seam for sources whose files live elsewhere (the Hugging Face hub today; object storage
//! next): a [`Remote`] pins a revision, lists its files there and fetches what the command reads
//! into a local folder (its cache snapshot), which is then resolved as a folder is. Which files a
//! run needs is the same for every remote and lives in [`needed`]; how a remote lists, fetches
//! whole files and fetches headers alone (ranged reads) is its own, behind [`Snapshot`]. What a
//! run did is said in one shape for every remote ([`RemoteSource`], [`Origin`], [`Fetched`]), so
//! that reports, the serve line and the run record name no remote in particular.

pub(crate) mod needed;

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::local::Listing;
use super::{LoadFormat, ResolveError, Resolved, Want};
use crate::config::ConfigFormat;
use crate::progress::DownloadProgress;

/// A source whose files are fetched before they are read. Each implementation pins the revision
/// (asking the remote, or its cache alone when offline), builds a [`Snapshot`] of it, hands that
/// to [`needed::select_and_fetch`], then records the run in its cache and fills
/// [`Resolved::remote`] and each kept file's [`Origin`].
pub(crate) trait Remote: fmt::Debug + Send + Sync {
    /// Resolves the remote as vLLM would, fetching what is missing from its local folder (unless
    /// offline). Returns the resolution and whether the source is pre-sharded (only with
    /// [`Want::Detect`]).
    fn resolve(&self, opts: &FetchOptions, want: Want) -> Result<(Resolved, bool), ResolveError>;
}

/// One pinned revision of a remote, as [`needed::select_and_fetch`] sees it.
pub(crate) trait Snapshot {
    /// The local folder that fetched files land in: the checkpoint's root.
    fn folder(&self) -> &Path;
    /// The files at the pinned revision (top level and subfolders).
    fn listing(&self) -> &Listing;
    /// Makes sure `files` are whole in [`Snapshot::folder`]: found there, or fetched.
    fn fetch(&mut self, files: &[String]) -> Result<(), ResolveError>;
    /// The safetensors headers alone of `files` (weights not on disk), by ranged reads or from
    /// an earlier run's copy: for commands that read no tensor data.
    fn fetch_headers(&mut self, files: &[String]) -> Result<(), ResolveError>;
}

/// What the command asks of a remote source.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FetchOptions<'a> {
    pub load_format: LoadFormat,
    pub config_format: ConfigFormat,
    /// The command copies the side files (`shard`): fetch every top-level file that is not
    /// weights too. Otherwise only what the command reads is fetched: the config, the index and
    /// the selected weights (a pre-sharded source's rank files, config and run records).
    pub side_files: bool,
    /// The command reads no tensor data (`inspect`, `plan`, `sizes`, `load --dry-run`): of the
    /// weight files not on disk, only the safetensors headers are fetched. A pre-sharded
    /// source's rank files are fetched whole all the same.
    pub headers_only: bool,
    /// Reports each download's progress.
    pub progress: &'a DownloadProgress,
}

/// Where a file of a remote source came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Origin {
    /// Already in the local cache.
    Cache,
    /// Downloaded by this run.
    Download,
    /// Only its header, fetched by this run (ranged requests).
    Header,
    /// Only its header, kept in the cache by an earlier run.
    CachedHeader,
}

impl Origin {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Origin::Cache => "cache",
            Origin::Download => "download",
            Origin::Header => "header",
            Origin::CachedHeader => "cached-header",
        }
    }
}

/// What a remote source resolved to, for reports, the serve line and the run record. The field
/// names are the hub's (`repo`, `commit`), which the JSON documents carry under `hub`.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct RemoteSource {
    /// The source as given: `org/name` for the hub.
    pub repo: String,
    /// `--revision` as given (branch, tag or commit).
    pub revision: String,
    /// The commit the revision points to.
    pub commit: String,
    /// The cache folder (`--download-dir`, or the remote's default).
    pub cache_dir: PathBuf,
    /// The cache's folder of that commit: the checkpoint folder.
    pub snapshot: PathBuf,
    /// True when nothing was asked of the remote: offline, a commit whose files were all
    /// cached, or a remote that could not be reached (see `note`).
    pub offline: bool,
    /// Every file this run downloaded (weights and side files), in file-name order.
    pub downloaded: Vec<String>,
    /// Why the cache was used without asking the remote, when it was not by choice.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// What this run fetched from the remote.
    pub fetched: Fetched,
}

/// What a remote source's run fetched: file contents, not counting the file list and the
/// metadata (HEAD) requests.
#[derive(Debug, Clone, Default, Serialize, schemars::JsonSchema)]
pub struct Fetched {
    /// Where from, for people: empty for the hub, else the store URL.
    pub from: String,
    /// Every byte fetched: headers and whole files.
    pub bytes: u64,
    /// Bytes read from the answers to header (`Range`) requests.
    pub header_bytes: u64,
    /// The weight files whose header was fetched.
    pub header_files: usize,
    /// Whole files downloaded, in file-name order (config, index, ...; weights for `shard` and
    /// `load`).
    pub files: Vec<String>,
    /// Their bytes.
    pub file_bytes: u64,
    /// Of `file_bytes`, those of weight files: tensor data.
    pub tensor_data_bytes: u64,
}
