//! The open stage: SOURCE resolved (a folder, or a hub repo through the cache), its config read
//! and every selected file's header validated. No tensor data is read.

use std::path::PathBuf;
use std::time::Instant;

use serde_json::{Map, Value};

use crate::checkpoint::HeaderError;
use crate::config::ConfigError;
use crate::resolve::ResolveError;
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

/// What every subcommand needs to find and read a checkpoint.
#[derive(Debug, Clone)]
pub struct SourceOptions {
    /// A checkpoint folder, or a Hugging Face Hub repo id (`org/name`) when no such path exists.
    pub source: PathBuf,
    pub load_format: resolve::LoadFormat,
    pub config_format: config::ConfigFormat,
    pub hf_overrides: Option<Map<String, Value>>,
    /// For a repo id: the branch, tag or commit (`main` when `None`), as vLLM's `--revision`.
    pub revision: Option<String>,
    /// For a repo id: the cache folder to use instead of `HF_HUB_CACHE` / `$HF_HOME/hub`, as
    /// vLLM's `--download-dir`.
    pub download_dir: Option<PathBuf>,
    /// Reports each download's progress (nothing by default).
    pub download_progress: resolve::hub::DownloadProgress,
    /// The command copies SOURCE's side files (config, tokenizer, README, ...) beside its output,
    /// as `shard` does: for a hub repo they are downloaded too. Otherwise only the files the
    /// command reads are.
    pub side_files: bool,
    /// The command reads no tensor data: of a hub repo's weight files, only the safetensors
    /// headers are fetched (not the files), and the checkpoint's data cannot be read.
    pub headers_only: bool,
}

/// A resolved checkpoint: its files, their headers and the model config. No tensor data is read.
#[derive(Debug, Clone)]
pub struct Opened {
    pub resolved: resolve::Resolved,
    pub config: config::ModelConfig,
    pub checkpoint: checkpoint::Checkpoint,
    pub timings: Timings,
}

impl Opened {
    /// For a hub repo id: what this run fetched from the hub.
    pub fn hub_fetched(&self) -> Option<resolve::hub::Fetched> {
        self.resolved.hub.as_ref().map(|h| h.fetched.clone())
    }
}

/// Seconds spent in each stage, for reports.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
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

/// Resolves `opts.source`, reads the config and every selected file's header.
pub fn open(opts: &SourceOptions) -> Result<Opened, OpenError> {
    open_with(opts, false)
}

/// [`open`], or for a pre-sharded folder (`pre_sharded`) only its config: the loader reads the
/// rank files itself.
pub fn open_with(opts: &SourceOptions, pre_sharded: bool) -> Result<Opened, OpenError> {
    let t = Instant::now();
    let resolved = match hub_request(opts)? {
        Some(req) => resolve::hub::resolve(&req.request(opts), resolve::hub::Want::Checkpoint)?.0,
        None if pre_sharded => resolve::resolve_pre_sharded(&opts.source, opts.config_format)?,
        None => resolve::resolve_local(&opts.source, opts.load_format, opts.config_format)?,
    };
    finish_open(opts, resolved, t.elapsed().as_secs_f64())
}

/// [`open_with`] for `load`: a folder or hub repo of `model-rank-*-part-*.safetensors` files is
/// opened as pre-sharded (the `bool`), anything else as a checkpoint.
pub fn open_detect(opts: &SourceOptions) -> Result<(Opened, RankFiles), OpenError> {
    match hub_request(opts)? {
        Some(req) => {
            let t = Instant::now();
            let (resolved, pre_sharded) =
                resolve::hub::resolve(&req.request(opts), resolve::hub::Want::Detect)?;
            let files = if pre_sharded {
                names::in_folder(&resolved.root)
            } else {
                RankFiles::new()
            };
            Ok((
                finish_open(opts, resolved, t.elapsed().as_secs_f64())?,
                files,
            ))
        }
        None => {
            let files = names::in_folder(&opts.source);
            Ok((open_with(opts, !files.is_empty())?, files))
        }
    }
}

/// A repo id's resolved settings, when SOURCE is one.
struct HubSettings {
    repo: String,
    revision: String,
    env: resolve::hub::HubEnv,
}

impl HubSettings {
    fn request<'a>(&'a self, opts: &'a SourceOptions) -> resolve::hub::HubRequest<'a> {
        resolve::hub::HubRequest {
            repo: &self.repo,
            revision: &self.revision,
            load_format: opts.load_format,
            config_format: opts.config_format,
            env: &self.env,
            progress: &opts.download_progress,
            side_files: opts.side_files,
            headers_only: opts.headers_only,
        }
    }
}

fn hub_request(opts: &SourceOptions) -> Result<Option<HubSettings>, OpenError> {
    resolve::local::refuse_missing_path(&opts.source)?;
    let Some(repo) = resolve::hub::repo_id(&opts.source) else {
        return Ok(None);
    };
    let revision = opts.revision.clone().unwrap_or_else(|| "main".into());
    // A revision becomes a file name under refs/; keep it inside.
    if revision.is_empty()
        || revision.starts_with('/')
        || revision
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return Err(OpenError::Usage(format!(
            "--revision '{revision}' is not a branch, tag or commit name"
        )));
    }
    Ok(Some(HubSettings {
        repo,
        revision,
        env: resolve::hub::HubEnv::from_env(opts.download_dir.as_deref())
            .map_err(|e| OpenError::Usage(e.to_string()))?,
    }))
}

/// Reads the config and every selected file's header.
fn finish_open(
    opts: &SourceOptions,
    resolved: resolve::Resolved,
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
    let remote = resolved.hub.as_ref().map(|h| &h.headers);
    let checkpoint = checkpoint::Checkpoint::open_with(
        &resolved.root,
        &resolved.file_names(),
        remote.unwrap_or(&Default::default()),
    )
    .map_err(OpenError::Headers)?;
    let headers_s = t.elapsed().as_secs_f64();
    Ok(Opened {
        resolved,
        config,
        checkpoint,
        timings: Timings {
            resolve_s,
            config_s,
            headers_s,
            plan_s: 0.0,
        },
    })
}
