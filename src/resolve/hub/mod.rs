//! Hugging Face Hub sources: a repo id (`org/name`, as vLLM takes it) becomes a snapshot folder of
//! the local Hugging Face cache that holds exactly the files the command reads (the config, the
//! index, the weights the load format selects), plus, for `shard` ([`HubRequest::side_files`]),
//! the side files (tokenizer, README, ...) it copies.
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
//! `http` makes them rather than hf-hub.
//!
//! Where this differs from huggingface_hub: partial downloads are `blobs/<etag>.part` (hf-hub's
//! name; a Python `.incomplete` file is adopted), download locks are `blobs/<etag>.lock` rather
//! than `.locks/`, and the file list of each commit is kept in `.wload/<commit>.json`.
//!
//! Commands that read no tensor data (`inspect`, `plan`, `sizes`, `load --dry-run`) set
//! [`HubRequest::headers_only`]: of the selected weight files they fetch only the safetensors
//! headers (`headers`, kept by `header_cache` in `wload-headers/`, outside the layout above).
//!
//! Which files to fetch follows vLLM's selection exactly: [`super::resolve_listing`] runs over the
//! repo's file list, with the index ([`super::index_to_read`], fetched first) dropping the shards
//! it does not name; only then are the kept weight files and the config fetched.
//!
//! Here: which commit and file list a revision stands for, and in what order files are fetched.
//! `env` reads the HF_* variables; `cache` knows the cache's layout and wload's file-list
//! records; `http` makes the requests; `download` links, downloads, resumes, retries and
//! locks; `headers` fetches headers alone and `header_cache` keeps them; `progress` feeds the
//! caller's bars; `error` words what went wrong.

mod cache;
mod capped;
mod download;
mod env;
mod error;
mod header_cache;
mod headers;
mod http;
mod progress;
mod url;

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::local::Listing;
use super::{LoadFormat, ResolveError, Resolved};
use crate::config::ConfigFormat;
pub use cache::folder_name;
use cache::{State, StateSource};
use download::Fetcher;
pub use env::{BadTimeout, HubEnv};
pub use error::{HubError, Redirected, Stalled, Why};
pub use headers::Fetched;
use http::Client;
pub use progress::DownloadProgress;

/// Where a file of a hub source came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Origin {
    /// Already in the local cache.
    Cache,
    /// Downloaded by this run.
    Download,
    /// Only its header, fetched by this run (`Range` requests).
    Header,
    /// Only its header, kept in the cache by an earlier run.
    CachedHeader,
}

impl Origin {
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Cache => "cache",
            Origin::Download => "download",
            Origin::Header => "header",
            Origin::CachedHeader => "cached-header",
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
    /// What this run fetched from the hub.
    pub fetched: Fetched,
    /// The weight files of which only the header is here (fetched, or kept by an earlier run),
    /// by name: the checkpoint is built from them, and their data cannot be read. Shared: reports
    /// clone the source, and a large repo's headers are megabytes.
    #[serde(skip)]
    pub headers:
        std::sync::Arc<std::collections::BTreeMap<String, crate::checkpoint::RemoteHeader>>,
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
    /// A pre-sharded folder (`model-rank-*-part-*.safetensors`, or `model-pp-*-tp-*-part-*`)
    /// when the repo is one, else a checkpoint (`load`).
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
    /// The command copies the side files (`shard`): download every top-level file that is not
    /// weights too. Otherwise only what the command reads is fetched: the config, the index and
    /// the selected weights (a pre-sharded repo's rank files, config and manifest).
    pub side_files: bool,
    /// The command reads no tensor data (`inspect`, `plan`, `sizes`, `load --dry-run`): of the
    /// weight files not in the cache, only the safetensors headers are fetched (see `headers`).
    /// A pre-sharded repo's rank files are downloaded whole all the same.
    pub headers_only: bool,
}

/// Resolves a repo id to a cache snapshot holding what is needed, downloading what is missing
/// (unless offline), and resolves that snapshot as vLLM would. Returns the resolution and whether
/// the repo is pre-sharded (only with [`Want::Detect`]).
pub fn resolve(req: &HubRequest, want: Want) -> Result<(Resolved, bool), ResolveError> {
    let repo_dir = req.env.cache_dir.join(folder_name(req.repo));
    let (state, note) = find_state(req, &repo_dir)?;
    let snapshot = cache::snapshot_dir(&repo_dir, &state.commit);
    let why = match &note {
        Some(n) => Some(Why::Unreachable(n.clone())),
        None if req.env.offline => Some(Why::Offline),
        None => None,
    };
    let mut fetcher = Fetcher::new(req, &repo_dir, &snapshot, &state.commit, why);
    let (mut resolved, pre_sharded, got) =
        select_and_fetch(req, want, &snapshot, &state.listing(), &mut fetcher)?;
    if state.source == StateSource::Hub {
        cache::record(&repo_dir, req.repo, req.revision, &state)?;
    }
    for f in &mut resolved.files {
        f.origin = (got.origins.get(&f.file))
            .or(fetcher.origins.get(&f.file))
            .copied();
    }
    let fetched = fetched(&fetcher, &got, &resolved);
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
        cache_dir: req.env.cache_dir.clone(),
        offline: state.source != StateSource::Hub && !fetcher.asked_hub() && !got.asked,
        snapshot,
        downloaded,
        note,
        fetched,
        headers: std::sync::Arc::new(got.headers),
    });
    Ok((resolved, pre_sharded))
}

/// What the run fetched: the downloads' bytes and the headers'.
fn fetched(fetcher: &Fetcher, got: &headers::Got, resolved: &Resolved) -> Fetched {
    let weights: std::collections::BTreeSet<&str> =
        resolved.files.iter().map(|f| f.file.as_str()).collect();
    let mut f = Fetched {
        header_bytes: got.bytes,
        header_files: got.files,
        ..Fetched::default()
    };
    for (name, bytes) in &fetcher.bytes() {
        f.files.push(name.clone());
        f.file_bytes += bytes;
        // A pre-sharded repo's rank files are tensor data too.
        if weights.contains(name.as_str()) || is_rank_file(name) {
            f.tensor_data_bytes += bytes;
        }
    }
    f.bytes = f.header_bytes + f.file_bytes;
    f
}

/// Selects as vLLM would, fetching first what selection reads (the index decides which weight
/// files are needed), then the config and the selected files, and the side files when the
/// command copies them.
fn select_and_fetch(
    req: &HubRequest,
    want: Want,
    snapshot: &Path,
    listing: &Listing,
    fetcher: &mut Fetcher,
) -> Result<(Resolved, bool, headers::Got), ResolveError> {
    let top = |keep: fn(&str) -> bool| -> Vec<String> {
        listing.top.iter().filter(|f| keep(f)).cloned().collect()
    };
    let side = if req.side_files {
        top(is_side_file)
    } else {
        Vec::new()
    };
    let rank_files = top(is_rank_file);
    if want == Want::Detect && !rank_files.is_empty() {
        // What the loader of a pre-sharded folder reads besides the rank files.
        let (_, config) = super::pick_config(snapshot, listing, req.config_format, false)?;
        let mut needed = rank_files;
        needed.push(config);
        needed.extend(quant_config(listing));
        // Every run record: wload.json, and those of `--ranks` runs uploaded together.
        needed.extend(
            (listing.top.iter())
                .filter(|n| crate::sharded::runs::is_record(n))
                .cloned(),
        );
        needed.extend(side);
        fetcher.ensure(&needed)?;
        return Ok((
            super::resolve_pre_sharded(snapshot, req.config_format)?,
            true,
            headers::Got::default(),
        ));
    }
    if let Some(index) = super::index_to_read(listing, req.load_format) {
        fetcher.ensure(&[index.to_string()])?;
    }
    let r = super::resolve_listing(snapshot, listing, req.load_format, req.config_format)?;
    let mut needed = if req.headers_only {
        Vec::new()
    } else {
        r.file_names()
    };
    needed.push(r.config_file.clone());
    needed.extend(quant_config(listing));
    needed.extend(side);
    fetcher.ensure(&needed)?;
    let got = if req.headers_only {
        let repo_dir = req.env.cache_dir.join(folder_name(req.repo));
        let commit = fetcher.commit();
        headers::get(
            req,
            &repo_dir,
            snapshot,
            commit,
            fetcher.why(),
            &r.file_names(),
        )?
    } else {
        headers::Got::default()
    };
    Ok((r, false, got))
}

/// `hf_quant_config.json` when the repo has it: vLLM reads the quantization config from it when
/// config.json has none, so every command needs it, not only `shard`'s side files.
fn quant_config(listing: &Listing) -> Option<String> {
    let name = crate::config::HF_QUANT_CONFIG;
    listing.has_top(name).then(|| name.to_string())
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

/// A part file `load` reads from a pre-sharded folder, of either pattern (`--pp` says which one
/// it expects, and the folder is checked against it).
fn is_rank_file(name: &str) -> bool {
    crate::sharded::names::RankFile::parse(name).is_some()
}

/// Asks the hub unless offline (or unless a commit is asked for whose file list is saved);
/// falls back to the cache when the hub cannot answer, as huggingface_hub does. The note says why.
fn find_state(req: &HubRequest, repo_dir: &Path) -> Result<(State, Option<String>), ResolveError> {
    let env = req.env;
    if env.offline {
        return Ok((cache::cached_state(req, repo_dir, Why::Offline)?, None));
    }
    // A saved list that cannot be read is only a missed shortcut online: the hub's answer
    // replaces it.
    if cache::is_commit(req.revision)
        && let Ok(Some(files)) = cache::saved_listing(repo_dir, req.revision, &Why::Offline)
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
            match cache::cached_state(req, repo_dir, why) {
                Ok(state) => Ok((state, Some(e.to_string()))),
                // Nothing cached: the hub's own error says best what is wrong.
                Err(HubError::NotCached { .. }) => Err(e.into()),
                // A damaged cache: that is what to fix (its message carries the hub's error).
                Err(damaged) => Err(damaged.into()),
            }
        }
    }
}

/// The hub's commit and file list for the revision.
fn repo_info(req: &HubRequest) -> Result<State, HubError> {
    let info = Client::new(req.env)
        .repo_info(req.repo, req.revision)
        .map_err(|e| error::http_error(req, None, req.revision, e))?;
    if !cache::is_commit(&info.sha) {
        return Err(HubError::BadListing {
            repo: req.repo.to_string(),
            endpoint: req.env.endpoint.clone(),
            message: format!("it names no commit (sha '{}')", url::shown(&info.sha)),
        });
    }
    // Names become paths under the snapshot: anything that could lead out of it is ignored.
    let safe = |f: &str| {
        !f.starts_with('/')
            && !f.contains('\0')
            && f.split('/').all(|c| !c.is_empty() && c != "." && c != "..")
    };
    Ok(State {
        commit: info.sha,
        files: info.siblings.into_iter().filter(|f| safe(f)).collect(),
        source: StateSource::Hub,
    })
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
            "src/resolve",
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
        // Pipeline-parallel files make a pre-sharded repo too (loaded with --pp).
        assert!(is_rank_file("model-pp-0-tp-0-part-0.safetensors"));
        assert!(!is_rank_file("model-pp-0-tp-00-part-0.safetensors"));
    }
}
