//! The open stage: SOURCE parsed and resolved (a folder, or a remote source such as a hub repo
//! through its cache), its config read and every selected file's header validated. No tensor
//! data is read. One entry point, [`open`], told what the caller wants ([`Want`]).

use std::path::PathBuf;
use std::time::Instant;

use serde_json::{Map, Value};

use crate::checkpoint::HeaderError;
use crate::config::ConfigError;
use crate::progress::DownloadProgress;
use crate::resolve::ResolveError;
pub use crate::resolve::Want;
use crate::resolve::remote::{FetchOptions, Fetched};
pub(crate) use crate::resolve::source::{Source, SourceError};
use crate::sharded::names::{self, RankFiles};
use crate::{checkpoint, config, resolve};

/// Why a source could not be opened; the commands' error keeps each kind's message and exit status.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    /// Every weight file whose header is malformed, not only the first.
    #[error("{} weight files could not be read", .0.len())]
    Headers(Vec<HeaderError>),
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A flag that names no usable revision or download folder.
    #[error("{0}")]
    Usage(String),
}

impl From<SourceError> for OpenError {
    fn from(e: SourceError) -> OpenError {
        match e {
            SourceError::Resolve(e) => OpenError::Resolve(e),
            SourceError::Usage(m) => OpenError::Usage(m),
        }
    }
}

/// What every subcommand needs to find and read a checkpoint.
#[derive(Debug, Clone)]
pub struct SourceOptions {
    /// SOURCE as given: a checkpoint folder, or a Hugging Face Hub repo id (`org/name`) when no
    /// such path exists. [`open`] parses it ([`Source::parse`]).
    pub source: PathBuf,
    pub load_format: resolve::LoadFormat,
    pub config_format: config::ConfigFormat,
    pub hf_overrides: Option<Map<String, Value>>,
    /// For a remote source: the branch, tag or commit (`main` when `None`), as vLLM's `--revision`.
    pub revision: Option<String>,
    /// For a remote source: the cache folder to use instead of the default (for the hub,
    /// `HF_HUB_CACHE` / `$HF_HOME/hub`), as vLLM's `--download-dir`.
    pub download_dir: Option<PathBuf>,
    /// Reports each download's progress (nothing by default).
    pub download_progress: DownloadProgress,
    /// The command copies SOURCE's side files (config, tokenizer, README, ...) beside its output,
    /// as `shard` does: for a remote source they are downloaded too. Otherwise only the files the
    /// command reads are.
    pub side_files: bool,
    /// The command reads no tensor data: of a remote source's weight files, only the
    /// safetensors headers are fetched (not the files), and the checkpoint's data cannot be read.
    pub headers_only: bool,
}

/// A resolved checkpoint: its files, their headers and the model config. No tensor data is read.
#[derive(Debug, Clone)]
pub struct Opened {
    pub resolved: resolve::Resolved,
    pub config: config::ModelConfig,
    pub checkpoint: checkpoint::Checkpoint,
    /// A pre-sharded folder's rank files (opened with [`Want::Detect`]); empty for a checkpoint.
    pub rank_files: RankFiles,
    pub timings: Timings,
}

impl Opened {
    /// For a remote source: what this run fetched from it.
    pub fn fetched(&self) -> Option<Fetched> {
        self.resolved.remote.as_ref().map(|r| r.fetched.clone())
    }
}

/// Seconds spent in each stage, for reports.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, schemars::JsonSchema)]
pub struct Timings {
    /// Listing the folder and choosing files (for a hub repo: and downloading what is missing).
    pub resolve_s: f64,
    /// Reading config.json / params.json.
    pub config_s: f64,
    /// Reading and validating every safetensors header.
    pub headers_s: f64,
    /// Mapping names and planning every rank (plan, shard, load).
    pub plan_s: f64,
}

/// Parses SOURCE ([`Source::parse`]), resolves it as `want` says (a remote source through its
/// cache), reads the config and every selected file's header. For a pre-sharded folder (with
/// [`Want::Detect`]) only its config is read: the loader reads the rank files itself.
pub fn open(opts: &SourceOptions, want: Want) -> Result<Opened, OpenError> {
    let t = Instant::now();
    let source = Source::parse(
        &opts.source,
        opts.revision.as_deref(),
        opts.download_dir.as_deref(),
    )?;
    let (resolved, pre_sharded) = source.resolve(&opts.fetch_options(), want)?;
    let rank_files = if pre_sharded {
        names::in_folder(&resolved.root)
    } else {
        RankFiles::new()
    };
    finish_open(opts, resolved, rank_files, t.elapsed().as_secs_f64())
}

impl SourceOptions {
    fn fetch_options(&self) -> FetchOptions<'_> {
        FetchOptions {
            load_format: self.load_format,
            config_format: self.config_format,
            side_files: self.side_files,
            headers_only: self.headers_only,
            progress: &self.download_progress,
        }
    }
}

/// Reads the config and every selected file's header.
fn finish_open(
    opts: &SourceOptions,
    resolved: resolve::Resolved,
    rank_files: RankFiles,
    resolve_s: f64,
) -> Result<Opened, OpenError> {
    let t = Instant::now();
    let config = config::load(
        &resolved.root,
        &resolved.config_file,
        resolved.config_format,
        opts.hf_overrides.as_ref(),
    )?;
    let config_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let checkpoint = checkpoint::Checkpoint::open_with(
        &resolved.root,
        &resolved.file_names(),
        &resolved.headers,
    )
    .map_err(OpenError::Headers)?;
    let headers_s = t.elapsed().as_secs_f64();
    Ok(Opened {
        resolved,
        config,
        checkpoint,
        rank_files,
        timings: Timings {
            resolve_s,
            config_s,
            headers_s,
            plan_s: 0.0,
        },
    })
}
