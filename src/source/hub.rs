//! Hugging Face Hub sources: a repo id (`org/name`, as vLLM takes it) becomes a snapshot folder of
//! the local Hugging Face cache that holds exactly the files the selected load format reads, plus
//! the side files (config, tokenizer, ...) that `shard` copies.
//!
//! The cache is the one Python's `huggingface_hub` keeps and vLLM, transformers and hf-hub share:
//! `<cache>/models--{org}--{name}/refs/<revision>` holds a commit hash, and
//! `snapshots/<commit>/<file>` are relative symlinks to `blobs/<etag>`. wload looks files up there
//! itself: hf-hub 0.5 honours neither `HF_HUB_CACHE` nor `HF_HUB_OFFLINE`, and a lookup must not
//! open a connection. The network is asked only for the repo's file list
//! (`GET {endpoint}/api/models/{repo}/revision/{rev}`), a missing file's etag (a blob the cache
//! already holds, under another commit, is linked rather than fetched again) and downloads, which
//! go into that same layout (`blobs/<etag>.part`, renamed into place when complete, then the
//! snapshot symlink) and resume with a `Range` request when a partial file is there. Each request
//! has huggingface_hub's timeouts (`HF_HUB_ETAG_TIMEOUT`, `HF_HUB_DOWNLOAD_TIMEOUT`), which is why
//! `hub/http.rs` makes them rather than hf-hub.
//!
//! Where this differs from huggingface_hub: partial downloads are `blobs/<etag>.part` (hf-hub's
//! name; a Python `.incomplete` file is adopted), download locks are `blobs/<etag>.lock` rather
//! than `.locks/`, and the file list of each commit is kept in `.wload/<commit>.json`.
//!
//! Which files to fetch follows vLLM's selection exactly: [`super::resolve_listing`] runs over the
//! repo's file list, with the index (a side file, fetched first) dropping the shards it does not
//! name; only then are the kept weight files fetched.

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use hf_hub::{Repo, RepoType};
use serde::{Deserialize, Serialize};

use http::{Client, HttpError, Limit, Meta};

use super::local::Listing;
use super::{LoadFormat, Resolved, SourceError};
use crate::config::ConfigFormat;
use crate::exec::Progress;

mod http;

/// Where a file of a hub source came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Origin {
    /// Already in the local cache.
    Cache,
    /// Downloaded by this run.
    Download,
}

impl Origin {
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Cache => "cache",
            Origin::Download => "download",
        }
    }
}

/// What a hub source resolved to.
#[derive(Debug, Clone, Serialize)]
pub struct HubSource {
    /// `org/name`.
    pub repo: String,
    /// `--revision` as given (branch, tag or commit).
    pub revision: String,
    /// The commit the revision points to.
    pub commit: String,
    /// The cache folder (`--download-dir`, `HF_HUB_CACHE` or `$HF_HOME/hub`).
    pub cache_dir: PathBuf,
    /// `snapshots/<commit>` of the repo in the cache: the checkpoint folder.
    pub snapshot: PathBuf,
    /// True when nothing was asked of the hub: `HF_HUB_OFFLINE`, a commit whose files were all
    /// cached, or a hub that could not be reached (see `note`).
    pub offline: bool,
    /// Every file this run downloaded (weights and side files), in file-name order.
    pub downloaded: Vec<String>,
    /// Why the cache was used without asking the hub, when it was not by choice.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

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
    #[error("{repo}: cannot reach {endpoint}: {message}")]
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
    #[error("{repo} (revision {revision}) is not in the Hugging Face cache {cache}{why}")]
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
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// A transfer that stopped sending data, each time it was resumed.
#[derive(Debug, thiserror::Error)]
#[error(
    "{repo}: downloading {file} from {endpoint}: no data for {secs} s, {tries} tries in a row (each resumed where the last stopped); the {have} of {size} bytes that arrived are kept in {part} and the next run resumes from there. {var} sets this timeout in seconds (default 10): raise it if the link is only slow",
    secs = limit.secs,
    var = limit.var
)]
pub struct Stalled {
    repo: String,
    file: String,
    endpoint: String,
    limit: Limit,
    tries: u32,
    have: u64,
    size: u64,
    part: PathBuf,
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

/// Makes the progress reporter for one download, given the file name and its size in bytes.
/// The binary draws bars on a terminal; the default reports nothing.
#[derive(Clone, Default)]
pub struct DownloadProgress(Option<Arc<DownloadBar>>);

type DownloadBar = dyn Fn(&str, u64) -> Box<dyn Progress> + Send + Sync;

impl DownloadProgress {
    pub fn new(f: impl Fn(&str, u64) -> Box<dyn Progress> + Send + Sync + 'static) -> Self {
        DownloadProgress(Some(Arc::new(f)))
    }

    fn start(&self, file: &str, size: u64) -> Box<dyn Progress> {
        match &self.0 {
            Some(f) => f(file, size),
            None => Box::new(crate::exec::Quiet),
        }
    }
}

impl fmt::Debug for DownloadProgress {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "DownloadProgress(bars)"
        } else {
            "DownloadProgress(quiet)"
        })
    }
}

/// The environment that Python's `huggingface_hub` reads, read the same way.
#[derive(Debug, Clone)]
pub struct HubEnv {
    /// `--download-dir`, else `HF_HUB_CACHE` (or the older `HUGGINGFACE_HUB_CACHE`), else
    /// `$HF_HOME/hub`, with `HF_HOME` defaulting to `$XDG_CACHE_HOME/huggingface` or
    /// `~/.cache/huggingface`.
    pub cache_dir: PathBuf,
    /// `HF_ENDPOINT`, default `https://huggingface.co`.
    pub endpoint: String,
    /// `HF_TOKEN` (or `HUGGING_FACE_HUB_TOKEN`), else the file `HF_TOKEN_PATH`
    /// (default `$HF_HOME/token`, where `hf auth login` writes it).
    pub token: Option<String>,
    /// `HF_HUB_OFFLINE` (or `TRANSFORMERS_OFFLINE`) is 1, ON, YES or TRUE: no connection at all.
    pub offline: bool,
    /// `HF_HUB_ETAG_TIMEOUT`, seconds: the longest silence while connecting to the hub or waiting
    /// for its answer to a metadata request (the file list, a file's etag).
    pub etag_timeout: u64,
    /// `HF_HUB_DOWNLOAD_TIMEOUT`, seconds: the longest silence while connecting for a transfer
    /// or waiting for its next bytes. It bounds a stall, not the transfer.
    pub download_timeout: u64,
}

/// huggingface_hub's default for both timeouts, in seconds.
const DEFAULT_TIMEOUT_SECS: u64 = 10;

/// A timeout variable whose value huggingface_hub would not take either.
#[derive(Debug, thiserror::Error)]
#[error(
    "{var}='{value}' is not a number of seconds: huggingface_hub reads it as a whole number (0 or unset means the default, {DEFAULT_TIMEOUT_SECS}); {why}"
)]
pub struct BadTimeout {
    pub var: &'static str,
    pub value: String,
    why: &'static str,
}

/// Reads a timeout as huggingface_hub does (`int(value) or 10`: surrounding blanks, a sign and
/// `_` between digits are allowed, 0 means the default). A negative value, which huggingface_hub
/// reads but its HTTP client then refuses, is refused here at once; so is one beyond ~136 years,
/// which no clock can add.
fn parse_timeout(var: &'static str, value: Option<&str>) -> Result<u64, BadTimeout> {
    let Some(value) = value else {
        return Ok(DEFAULT_TIMEOUT_SECS);
    };
    let bad = |why| BadTimeout {
        var,
        value: value.to_string(),
        why,
    };
    let t = value.trim();
    let (negative, digits) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let well_formed = !digits.is_empty()
        && digits
            .split('_')
            .all(|g| !g.is_empty() && g.bytes().all(|b| b.is_ascii_digit()));
    if !well_formed {
        return Err(bad("write it as digits only, e.g. 30"));
    }
    let secs: u64 = match digits.replace('_', "").parse() {
        Ok(n) if n <= u64::from(u32::MAX) => n,
        _ => return Err(bad("it is too large")),
    };
    match secs {
        0 => Ok(DEFAULT_TIMEOUT_SECS),
        _ if negative => Err(bad("a timeout cannot be negative")),
        n => Ok(n),
    }
}

impl HubEnv {
    /// The environment, or the timeout variable that is malformed (a usage error).
    pub fn from_env(download_dir: Option<&Path>) -> Result<HubEnv, BadTimeout> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let home = || var("HOME").unwrap_or_else(|| "/".into());
        let expand = |p: String| match p.strip_prefix("~/") {
            Some(rest) => Path::new(&home()).join(rest),
            None if p == "~" => PathBuf::from(home()),
            None => PathBuf::from(p),
        };
        let hf_home = var("HF_HOME").map(expand).unwrap_or_else(|| {
            var("XDG_CACHE_HOME")
                .map(expand)
                .unwrap_or_else(|| Path::new(&home()).join(".cache"))
                .join("huggingface")
        });
        let cache_dir = match download_dir {
            Some(d) => d.to_path_buf(),
            None => var("HF_HUB_CACHE")
                .or_else(|| var("HUGGINGFACE_HUB_CACHE"))
                .map(expand)
                .unwrap_or_else(|| hf_home.join("hub")),
        };
        let token = var("HF_TOKEN")
            .or_else(|| var("HUGGING_FACE_HUB_TOKEN"))
            .or_else(|| {
                let path = var("HF_TOKEN_PATH")
                    .map(expand)
                    .unwrap_or_else(|| hf_home.join("token"));
                crate::small_file::read_to_string(&path).ok()
            })
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty());
        let truthy = |k: &str| {
            var(k).is_some_and(|v| {
                ["1", "ON", "YES", "TRUE"].contains(&v.trim().to_ascii_uppercase().as_str())
            })
        };
        let timeout = |k| parse_timeout(k, var(k).as_deref());
        Ok(HubEnv {
            cache_dir,
            endpoint: var("HF_ENDPOINT")
                .map(|e| e.trim_end_matches('/').to_string())
                .unwrap_or_else(|| "https://huggingface.co".into()),
            token,
            offline: truthy("HF_HUB_OFFLINE") || truthy("TRANSFORMERS_OFFLINE"),
            etag_timeout: timeout("HF_HUB_ETAG_TIMEOUT")?,
            download_timeout: timeout("HF_HUB_DOWNLOAD_TIMEOUT")?,
        })
    }
}

/// The repo id SOURCE names, when it is one: not an existing local path, and shaped like
/// `org/name` (`^[A-Za-z0-9][\w.-]*/[\w.-]+$`).
pub fn repo_id(source: &Path) -> Option<String> {
    let s = source.to_str()?;
    if source.exists() {
        return None;
    }
    let (org, name) = s.split_once('/')?;
    let word = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-');
    let ok = org.starts_with(|c: char| c.is_ascii_alphanumeric())
        && org.chars().all(word)
        && !name.is_empty()
        && name.chars().all(word);
    ok.then(|| s.to_string())
}

/// What the caller wants from the repo.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// A checkpoint, selected as vLLM does.
    Checkpoint,
    /// A pre-sharded folder (`model-rank-*-part-*.safetensors`) when the repo is one, else a
    /// checkpoint (`load`).
    Detect,
}

/// One hub source to resolve.
#[derive(Debug, Clone)]
pub struct HubRequest<'a> {
    pub repo: &'a str,
    pub revision: &'a str,
    pub load_format: LoadFormat,
    pub config_format: ConfigFormat,
    pub env: &'a HubEnv,
    pub progress: &'a DownloadProgress,
}

/// Resolves a repo id to a cache snapshot holding what is needed, downloading what is missing
/// (unless offline), and resolves that snapshot as vLLM would. Returns the resolution and whether
/// the repo is pre-sharded (only with [`Want::Detect`]).
pub fn resolve(req: &HubRequest, want: Want) -> Result<(Resolved, bool), SourceError> {
    let env = req.env;
    let repo_dir = env.cache_dir.join(folder_name(req.repo));
    let (state, note) = find_state(req, &repo_dir)?;
    let snapshot = repo_dir.join("snapshots").join(&state.commit);
    let listing = to_listing(&state.files);
    let mut fetcher = Fetcher {
        req,
        repo_dir: &repo_dir,
        snapshot: &snapshot,
        commit: &state.commit,
        why: match &note {
            Some(n) => Some(Why::Unreachable(n.clone())),
            None if env.offline => Some(Why::Offline),
            None => None,
        },
        origins: BTreeMap::new(),
        client: None,
    };

    // Side files first: the index among them decides which weight files are needed.
    let side: Vec<String> = listing
        .top
        .iter()
        .filter(|f| is_side_file(f))
        .cloned()
        .collect();
    fetcher.ensure(&side)?;

    let rank_files: Vec<String> = listing
        .top
        .iter()
        .filter(|f| is_rank_file(f))
        .cloned()
        .collect();
    let pre_sharded = want == Want::Detect && !rank_files.is_empty();
    let mut resolved = if pre_sharded {
        fetcher.ensure(&rank_files)?;
        super::resolve_pre_sharded(&snapshot, req.config_format)?
    } else {
        let r = super::resolve_listing(&snapshot, &listing, req.load_format, req.config_format)?;
        fetcher.ensure(&r.file_names())?;
        r
    };

    if state.source == StateSource::Hub {
        // As huggingface_hub does: a ref for a branch or tag, none for a commit.
        if req.revision != state.commit {
            write_atomic(
                &repo_dir.join("refs").join(req.revision),
                state.commit.as_bytes(),
            )?;
        }
        let listing = SavedListing {
            repo: req.repo.to_string(),
            commit: state.commit.clone(),
            files: state.files.clone(),
        };
        let text = serde_json::to_vec_pretty(&listing).expect("a listing serialises");
        write_atomic(&listing_path(&repo_dir, &state.commit), &text)?;
    }

    for f in &mut resolved.files {
        f.origin = fetcher.origins.get(&f.file).copied();
    }
    let downloaded = fetcher
        .origins
        .iter()
        .filter(|(_, o)| **o == Origin::Download)
        .map(|(f, _)| f.clone())
        .collect();
    resolved.hub = Some(HubSource {
        repo: req.repo.to_string(),
        revision: req.revision.to_string(),
        commit: state.commit.clone(),
        cache_dir: env.cache_dir.clone(),
        snapshot: snapshot.clone(),
        offline: state.source != StateSource::Hub && fetcher.client.is_none(),
        downloaded,
        note,
    });
    Ok((resolved, pre_sharded))
}

/// `models--org--name`, as huggingface_hub names a model repo's cache folder.
pub fn folder_name(repo: &str) -> String {
    format!("models--{}", repo.replace('/', "--"))
}

/// A full commit hash, which a revision may be.
fn is_commit(revision: &str) -> bool {
    revision.len() == 40 && revision.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A top-level file of a repo that is not weights: config, tokenizer, generation config, index,
/// chat templates, README and licence. What `shard` copies next to the per-rank files, and what
/// vLLM's own snapshot holds beside the weights. Dotfiles (`.gitattributes`) are left out, and so
/// is anything in a subfolder (vLLM ignores `original/**` and reads only the top level).
fn is_side_file(name: &str) -> bool {
    // Not vLLM's exact, case-sensitive test: `MODEL.BIN` is not fetched as a side file either.
    !name.contains('/')
        && !name.starts_with('.')
        && super::select::weight_kind(&name.to_ascii_lowercase()).is_none()
}

/// A part file `load` reads from a pre-sharded folder (pipeline parallelism off).
fn is_rank_file(name: &str) -> bool {
    crate::rank_files::RankFile::parse(name).is_some_and(|f| f.pp.is_none())
}

fn to_listing(files: &[String]) -> Listing {
    let mut l = Listing::default();
    for f in files {
        if f.contains('/') {
            l.nested.push(f.clone());
        } else {
            l.top.push(f.clone());
        }
    }
    l.top.sort();
    l.nested.sort();
    l
}

/// The repo's file list as the hub gave it, kept in the cache (`.wload/<commit>.json` inside the
/// repo's folder, where huggingface_hub's own tools do not look) so that an offline run selects
/// from the same list as the online one.
#[derive(Debug, Serialize, Deserialize)]
struct SavedListing {
    repo: String,
    commit: String,
    files: Vec<String>,
}

fn listing_path(repo_dir: &Path, commit: &str) -> PathBuf {
    repo_dir.join(".wload").join(format!("{commit}.json"))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StateSource {
    /// The hub's answer for the revision.
    Hub,
    /// The file list saved by an earlier run.
    Saved,
    /// The snapshot folder's own files (a cache written by another tool).
    Snapshot,
}

/// The commit a revision points to and the repo's files at that commit.
struct State {
    commit: String,
    files: Vec<String>,
    source: StateSource,
}

/// Asks the hub unless offline (or unless a commit is asked for whose file list is saved);
/// falls back to the cache when the hub cannot answer, as huggingface_hub does. The note says why.
fn find_state(req: &HubRequest, repo_dir: &Path) -> Result<(State, Option<String>), SourceError> {
    let env = req.env;
    if env.offline {
        return Ok((cached_state(req, repo_dir, Why::Offline)?, None));
    }
    if is_commit(req.revision)
        && let Some(files) = saved_listing(repo_dir, req.revision)
    {
        return Ok((
            State {
                commit: req.revision.to_string(),
                files,
                source: StateSource::Saved,
            },
            None,
        ));
    }
    match repo_info(req) {
        Ok(state) => Ok((state, None)),
        Err(e) => {
            let why = Why::Unreachable(e.to_string());
            match cached_state(req, repo_dir, why) {
                Ok(state) => Ok((state, Some(e.to_string()))),
                // Nothing cached: the hub's own error says best what is wrong.
                Err(_) => Err(e.into()),
            }
        }
    }
}

/// The state of the cache alone: the ref (or the commit given), the snapshot, and the saved file
/// list or else the snapshot's files.
fn cached_state(req: &HubRequest, repo_dir: &Path, why: Why) -> Result<State, HubError> {
    let not_cached = || HubError::NotCached {
        repo: req.repo.to_string(),
        revision: req.revision.to_string(),
        cache: req.env.cache_dir.clone(),
        why: why.clone(),
    };
    let commit = if is_commit(req.revision) {
        req.revision.to_string()
    } else {
        crate::small_file::read_to_string(&repo_dir.join("refs").join(req.revision))
            .map_err(|_| not_cached())?
            .trim()
            .to_string()
    };
    let snapshot = repo_dir.join("snapshots").join(&commit);
    if !snapshot.is_dir() {
        return Err(not_cached());
    }
    if let Some(files) = saved_listing(repo_dir, &commit) {
        return Ok(State {
            commit,
            files,
            source: StateSource::Saved,
        });
    }
    // The snapshot's own files, plus those its indexes name: a shard the index lists but the
    // cache lacks is then reported as not cached, not as a broken checkpoint.
    let listing =
        super::local::list(&snapshot).map_err(|(path, source)| HubError::Io { path, source })?;
    let mut files: Vec<String> = listing.all().map(str::to_string).collect();
    for index in [
        LoadFormat::Hf.index_file(),
        LoadFormat::Mistral.index_file(),
    ] {
        if listing.has_top(index)
            && let Ok(named) = super::index::files_named(&snapshot.join(index))
        {
            files.extend(named);
        }
    }
    files.sort();
    files.dedup();
    Ok(State {
        commit,
        files,
        source: StateSource::Snapshot,
    })
}

fn saved_listing(repo_dir: &Path, commit: &str) -> Option<Vec<String>> {
    let text = crate::small_file::read(&listing_path(repo_dir, commit)).ok()?;
    let saved: SavedListing = serde_json::from_slice(&text).ok()?;
    (saved.commit == commit).then_some(saved.files)
}

/// The hub's commit and file list for the revision.
fn repo_info(req: &HubRequest) -> Result<State, HubError> {
    let info = Client::new(req.env)
        .repo_info(&Repo::with_revision(
            req.repo.to_string(),
            RepoType::Model,
            req.revision.to_string(),
        ))
        .map_err(|e| http_error(req, None, req.revision, e))?;
    if !is_commit(&info.sha) {
        return Err(HubError::Network {
            repo: req.repo.to_string(),
            endpoint: req.env.endpoint.clone(),
            message: format!("the answer names no commit (sha '{}')", info.sha),
        });
    }
    // Names become paths under the snapshot: anything that could lead out of it is ignored.
    let safe = |f: &str| {
        !f.starts_with('/') && f.split('/').all(|c| !c.is_empty() && c != "." && c != "..")
    };
    Ok(State {
        commit: info.sha,
        files: info
            .siblings
            .into_iter()
            .map(|s| s.rfilename)
            .filter(|f| safe(f))
            .collect(),
        source: StateSource::Hub,
    })
}

/// Words a failed request about `file` (or the repo itself). A stalled transfer is worded where
/// it is retried ([`Fetcher::transfer`]), which knows how far it got.
fn http_error(req: &HubRequest, file: Option<&str>, commit: &str, e: HttpError) -> HubError {
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

/// Makes sure files are in the snapshot: found in the cache, or downloaded.
struct Fetcher<'a> {
    req: &'a HubRequest<'a>,
    repo_dir: &'a Path,
    snapshot: &'a Path,
    commit: &'a str,
    /// Set when nothing may be downloaded, and why.
    why: Option<Why>,
    origins: BTreeMap<String, Origin>,
    /// Made on the first download.
    client: Option<Client>,
}

/// Files downloaded at once.
const PARALLEL_DOWNLOADS: usize = 4;

/// Failed tries in a row, per request; a try that brought new bytes before it failed starts the
/// count again (as huggingface_hub does), so a long transfer over a flaky link still completes.
const DOWNLOAD_ATTEMPTS: u32 = 4;

impl Fetcher<'_> {
    fn ensure(&mut self, files: &[String]) -> Result<(), SourceError> {
        let mut missing = Vec::new();
        for f in files {
            if self.origins.contains_key(f) {
                continue;
            }
            // `is_file` follows the symlink: a link whose blob is gone is not cached.
            let path = self.snapshot.join(f);
            if path.is_file() {
                self.origins.insert(f.clone(), Origin::Cache);
            } else {
                missing.push(f.clone());
            }
        }
        if missing.is_empty() {
            return Ok(());
        }
        if let Some(why) = &self.why {
            return Err(HubError::FilesNotCached {
                repo: self.req.repo.to_string(),
                revision: self.req.revision.to_string(),
                snapshot: self.snapshot.to_path_buf(),
                files: missing,
                why: why.clone(),
            }
            .into());
        }
        if self.client.is_none() {
            adopt_partial_downloads(&self.repo_dir.join("blobs"));
            self.client = Some(Client::new(self.req.env));
        }
        for f in &missing {
            // A link left behind by a deleted blob would stop the new one from being linked.
            let path = self.snapshot.join(f);
            if path.symlink_metadata().is_ok() {
                let _ = fs::remove_file(&path);
            }
        }
        let client = self.client.as_ref().expect("made above");
        let got = self.download(client, &missing)?;
        self.origins.extend(missing.into_iter().zip(got));
        Ok(())
    }

    /// Fetches `files` a few at a time, in file order each one's origin; the first failure
    /// (in file order) is returned.
    fn download(&self, client: &Client, files: &[String]) -> Result<Vec<Origin>, HubError> {
        let next = AtomicUsize::new(0);
        let failed = AtomicBool::new(false);
        let errors: Mutex<Vec<(usize, HubError)>> = Mutex::new(Vec::new());
        let origins: Mutex<Vec<Origin>> = Mutex::new(vec![Origin::Download; files.len()]);
        std::thread::scope(|s| {
            for _ in 0..PARALLEL_DOWNLOADS.min(files.len()) {
                s.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= files.len() || failed.load(Ordering::Relaxed) {
                            break;
                        }
                        match self.download_one(client, &files[i]) {
                            Ok(o) => origins.lock().expect("not poisoned")[i] = o,
                            Err(e) => {
                                failed.store(true, Ordering::Relaxed);
                                errors.lock().expect("not poisoned").push((i, e));
                            }
                        }
                    }
                });
            }
        });
        let mut errors = errors.into_inner().expect("not poisoned");
        errors.sort_by_key(|(i, _)| *i);
        match errors.into_iter().next() {
            Some((_, e)) => Err(e),
            None => Ok(origins.into_inner().expect("not poisoned")),
        }
    }

    /// Puts one file in the snapshot: a link to the blob when the cache has it already (the same
    /// content under another commit), else a download into `blobs/<etag>.part`, resumed from
    /// what is there, renamed to the blob when complete.
    fn download_one(&self, client: &Client, file: &str) -> Result<Origin, HubError> {
        // Pinned to the commit, so that every file comes from the same one even if the branch
        // moves meanwhile.
        let repo = Repo::with_revision(
            self.req.repo.to_string(),
            RepoType::Model,
            self.commit.to_string(),
        );
        let url = client.file_url(&repo, file);
        let fail = |e| http_error(self.req, Some(file), self.commit, e);
        let meta = retried(|| client.metadata(&url)).map_err(fail)?;
        if meta.commit != self.commit {
            return Err(HubError::Download {
                repo: self.req.repo.to_string(),
                file: file.to_string(),
                message: format!(
                    "the hub answered for commit {} rather than {}",
                    meta.commit, self.commit
                ),
            });
        }
        let blobs = self.repo_dir.join("blobs");
        let blob = blobs.join(&meta.etag);
        // huggingface_hub asks for the etag first and only links a blob it already has (the
        // same content under another commit); so does this.
        let complete = || fs::metadata(&blob).is_ok_and(|m| m.is_file() && m.len() == meta.size);
        if complete() {
            self.link(file, &meta.etag)?;
            return Ok(Origin::Cache);
        }
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| HubError::Io { path, source }
        };
        fs::create_dir_all(&blobs).map_err(io(&blobs))?;
        let _lock = self.lock(client, &blob, file)?;
        // Another process may have completed it while this one waited for the lock.
        if complete() {
            self.link(file, &meta.etag)?;
            return Ok(Origin::Cache);
        }
        let part = blobs.join(format!("{}.part", meta.etag));
        self.transfer(client, &url, file, &meta, &part)?;
        fs::rename(&part, &blob).map_err(io(&part))?;
        self.link(file, &meta.etag)?;
        Ok(Origin::Download)
    }

    /// Completes `part`, retrying a transfer that broke off or stalled, each try resuming from
    /// what the ones before it wrote.
    fn transfer(
        &self,
        client: &Client,
        url: &str,
        file: &str,
        meta: &Meta,
        part: &Path,
    ) -> Result<(), HubError> {
        let len = || fs::metadata(part).map_or(0, |m| m.len());
        let mut bar = Shown {
            make: self.req.progress,
            file,
            bar: None,
            shown: 0,
        };
        let mut tries = 0;
        loop {
            let before = len();
            let got = client.fetch(url, part, meta.size, &mut |have| bar.show(meta.size, have));
            let Err(e) = got else {
                return Ok(());
            };
            let retry = match &e {
                // What is there is not this file's beginning (longer than the file, or complete
                // but not yet renamed when the hub says so): start it again.
                HttpError::Status(416) => fs::remove_file(part).is_ok(),
                e => e.is_transient(),
            };
            tries = if len() > before { 1 } else { tries + 1 };
            if !retry || tries >= DOWNLOAD_ATTEMPTS {
                return Err(match e {
                    HttpError::Timeout(limit) => HubError::DownloadStalled(Box::new(Stalled {
                        repo: self.req.repo.to_string(),
                        file: file.to_string(),
                        endpoint: self.req.env.endpoint.clone(),
                        limit,
                        tries,
                        have: len(),
                        size: meta.size,
                        part: part.to_path_buf(),
                    })),
                    e => http_error(self.req, Some(file), self.commit, e),
                });
            }
            backoff(&e, tries);
        }
    }

    /// Holds `blobs/<etag>.lock` (hf-hub's lock) so that two downloads of one blob, by two runs
    /// or by two files of this one with the same content, do not append to one partial file.
    /// The holder is waited for while its partial file grows; one that has written nothing for
    /// `HF_HUB_DOWNLOAD_TIMEOUT` is given up on, as a stalled transfer would be. A lock dies with its
    /// process, so none is ever left stale.
    fn lock(&self, client: &Client, blob: &Path, file: &str) -> Result<fs::File, HubError> {
        use std::os::fd::AsRawFd;
        use std::time::{Duration, Instant};
        let path = blob.with_extension("lock");
        let part = blob.with_extension("part");
        let lock = fs::File::create(&path).map_err(|source| HubError::Io {
            path: path.clone(),
            source,
        })?;
        let patience = Duration::from_secs(client.download.secs);
        let len = || fs::metadata(&part).map_or(0, |m| m.len());
        let (mut seen, mut since) = (len(), Instant::now());
        loop {
            // SAFETY: flock on a descriptor this function owns; no memory is involved.
            if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return Ok(lock);
            }
            if len() != seen {
                (seen, since) = (len(), Instant::now());
            } else if since.elapsed() > patience {
                return Err(HubError::Download {
                    repo: self.req.repo.to_string(),
                    file: file.to_string(),
                    message: format!(
                        "{} is held by another download of the same content, which has written nothing to {} for {} s; run again when it is done",
                        path.display(),
                        part.display(),
                        patience.as_secs()
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// `snapshots/<commit>/<file>` → `../../blobs/<etag>` (one more `..` per folder in `file`).
    fn link(&self, file: &str, etag: &str) -> Result<(), HubError> {
        let link = self.snapshot.join(file);
        let io = |source| HubError::Io {
            path: link.clone(),
            source,
        };
        let mut target = PathBuf::from("../..");
        for _ in 1..Path::new(file).components().count() {
            target.push("..");
        }
        target.push("blobs");
        target.push(etag);
        fs::create_dir_all(link.parent().expect("in the snapshot")).map_err(io)?;
        match std::os::unix::fs::symlink(&target, &link) {
            // Another process linked it meanwhile.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && link.is_file() => Ok(()),
            other => other.map_err(io),
        }
    }
}

/// huggingface_hub leaves an interrupted download in `blobs/<etag>.incomplete`; hf-hub resumes
/// from `blobs/<etag>.part`. Renaming the first to the second lets a download that Python (or
/// vLLM) started be resumed here instead of starting over. Both are named by the file's etag, so
/// no request is needed to match them.
fn adopt_partial_downloads(blobs: &Path) {
    let Ok(rd) = fs::read_dir(blobs) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(etag) = name.strip_suffix(".incomplete") {
            let part = blobs.join(format!("{etag}.part"));
            if !part.exists() {
                let _ = fs::rename(e.path(), part);
            }
        }
    }
}

/// Writes a small file whole or not at all.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), HubError> {
    let io = |source| HubError::Io {
        path: path.to_path_buf(),
        source,
    };
    let dir = path.parent().expect("cache paths have a parent");
    fs::create_dir_all(dir).map_err(io)?;
    let tmp = dir.join(format!(
        ".{}.wload-tmp-{}",
        path.file_name().expect("a file name").to_string_lossy(),
        std::process::id()
    ));
    fs::write(&tmp, bytes).map_err(io)?;
    fs::rename(&tmp, path).map_err(io)
}

/// Asks again, a few times, when the network rather than the request failed. A metadata request
/// that timed out is not asked again: a hub silent for that long is reported at once, as
/// huggingface_hub does, rather than after several timeouts.
fn retried<T>(mut f: impl FnMut() -> Result<T, HttpError>) -> Result<T, HttpError> {
    let mut tries = 0;
    loop {
        tries += 1;
        match f() {
            Err(e)
                if e.is_transient()
                    && !matches!(e, HttpError::Timeout(_))
                    && tries < DOWNLOAD_ATTEMPTS =>
            {
                backoff(&e, tries)
            }
            other => return other,
        }
    }
}

/// Waits before another try, unless the last one already waited out a timeout.
fn backoff(e: &HttpError, tries: u32) {
    if !matches!(e, HttpError::Timeout(_)) {
        std::thread::sleep(std::time::Duration::from_millis(250 << tries.min(4)));
    }
}

/// A download's progress bar, made when the first try starts, showing the most of the file that
/// has arrived: resumed bytes count once, and bytes fetched again after a restart do not count.
struct Shown<'a> {
    make: &'a DownloadProgress,
    file: &'a str,
    bar: Option<Box<dyn Progress>>,
    shown: u64,
}

impl Shown<'_> {
    fn show(&mut self, size: u64, have: u64) {
        let bar = self
            .bar
            .get_or_insert_with(|| self.make.start(self.file, size));
        if have > self.shown {
            bar.advance(have - self.shown);
            self.shown = have;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_ids_are_recognised() {
        for id in ["meta-llama/Llama-3.1-8B", "a/b", "Qwen/Qwen2.5-0.5B_x.y"] {
            assert_eq!(repo_id(Path::new(id)).as_deref(), Some(id), "{id}");
        }
        for not in [
            "gpt2",
            "./org/name",
            "/abs/path",
            "org/name/sub",
            "-org/name",
            "org/",
            "/name",
            "org/na me",
            "src/source",
        ] {
            assert_eq!(repo_id(Path::new(not)), None, "{not}");
        }
    }

    #[test]
    fn side_files_are_top_level_non_weights() {
        for yes in [
            "config.json",
            "generation_config.json",
            "tokenizer.json",
            "tokenizer.model",
            "tokenizer_config.json",
            "params.json",
            "chat_template.jinja",
            "model.safetensors.index.json",
            "README.md",
        ] {
            assert!(is_side_file(yes), "{yes}");
        }
        for no in [
            "model.safetensors",
            "pytorch_model.bin",
            "consolidated.pth",
            "model.gguf",
            "tf_model.h5",
            "flax_model.msgpack",
            ".gitattributes",
            "original/params.json",
        ] {
            assert!(!is_side_file(no), "{no}");
        }
    }

    #[test]
    fn rank_files_match_the_loader() {
        assert!(is_rank_file("model-rank-0-part-0.safetensors"));
        assert!(is_rank_file("model-rank-12-part-3.safetensors"));
        assert!(!is_rank_file("model-rank-a-part-0.safetensors"));
        assert!(!is_rank_file("model-rank-0-part-.safetensors"));
        assert!(!is_rank_file("model-00001-of-00002.safetensors"));
    }

    #[test]
    fn progress_shows_the_most_that_arrived_once() {
        use std::sync::atomic::AtomicU64;
        struct Count(Arc<AtomicU64>);
        impl Progress for Count {
            fn advance(&self, n: u64) {
                self.0.fetch_add(n, Ordering::Relaxed);
            }
        }
        let total = Arc::new(AtomicU64::new(0));
        let t = total.clone();
        let make = DownloadProgress::new(move |_, _| Box::new(Count(t.clone())));
        let mut bar = Shown {
            make: &make,
            file: "f",
            bar: None,
            shown: 0,
        };
        bar.show(100, 40); // resumed at 40
        bar.show(100, 50);
        bar.show(100, 0); // the server ignored the Range: from the start again
        bar.show(100, 30);
        assert_eq!(total.load(Ordering::Relaxed), 50);
        bar.show(100, 100);
        assert_eq!(total.load(Ordering::Relaxed), 100);
    }

    #[test]
    fn timeouts_are_read_as_huggingface_hub_reads_them() {
        let read = |v| parse_timeout("HF_HUB_ETAG_TIMEOUT", v);
        assert_eq!(read(None).unwrap(), 10);
        for (v, secs) in [
            ("1", 1),
            (" 30 ", 30),
            ("+7", 7),
            ("1_000", 1000),
            ("0", 10),
            ("-0", 10),
            ("007", 7),
        ] {
            assert_eq!(read(Some(v)).unwrap(), secs, "{v}");
        }
        for v in [
            "1.5",
            "ten",
            "",
            " ",
            "1e3",
            "-5",
            "1__0",
            "_1",
            "1_",
            "0x10",
            "99999999999999999999",
            "4294967296",
        ] {
            let e = read(Some(v)).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("HF_HUB_ETAG_TIMEOUT='{v}'")),
                "{v}: {e}"
            );
        }
    }
}
