//! Hugging Face Hub sources: a repo id (`org/name`, as vLLM takes it) becomes a snapshot folder of
//! the local Hugging Face cache that holds exactly the files the command reads (the config, the
//! index, the weights the load format selects), plus, for `shard` ([`FetchOptions::side_files`]),
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
//! [`FetchOptions::headers_only`]: of the selected weight files they fetch only the safetensors
//! headers (`headers`, kept by `header_cache` in `wload-headers/`, outside the layout above).
//!
//! The hub is the first [`Remote`]: which files to fetch, and in what order, is the same for every
//! remote source ([`crate::resolve::remote::needed`]).
//!
//! Here: which commit and file list a revision stands for, and the hub's [`Snapshot`] of it.
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

use std::path::Path;

use super::local::Listing;
use super::remote::{FetchOptions, Fetched, Origin, Remote, RemoteSource, Snapshot, needed};
use super::{ResolveError, Resolved, Want};
use crate::progress::DownloadProgress;
pub(crate) use cache::folder_name;
use cache::{State, StateSource};
use download::Fetcher;
pub(crate) use env::HubEnv;
pub(crate) use error::{HubError, Stalled, Why};
use http::Client;

/// A Hugging Face Hub repo, at a revision, read under the HF_* environment.
#[derive(Debug)]
pub(crate) struct Hub {
    /// `org/name`.
    repo: String,
    /// `--revision`, `main` when not given.
    revision: String,
    env: HubEnv,
}

impl Hub {
    /// SOURCE as a hub repo, when it is a repo id ([`repo_id`]); an error names a `--revision`
    /// that is no ref name, or an HF_* variable (or `--download-dir`) that cannot be used.
    pub(crate) fn parse(
        source: &Path,
        revision: Option<&str>,
        download_dir: Option<&Path>,
    ) -> Result<Option<Hub>, String> {
        let Some(repo) = repo_id(source) else {
            return Ok(None);
        };
        let revision = revision.unwrap_or("main").to_string();
        // A revision becomes a file name under refs/; keep it inside.
        if revision.is_empty()
            || revision.starts_with('/')
            || revision
                .split('/')
                .any(|c| c.is_empty() || c == "." || c == "..")
        {
            return Err(format!(
                "--revision '{revision}' is not a branch, tag or commit name"
            ));
        }
        let env = HubEnv::from_env(download_dir).map_err(|e| e.to_string())?;
        Ok(Some(Hub {
            repo,
            revision,
            env,
        }))
    }

    fn request<'a>(&'a self, opts: &FetchOptions<'a>) -> HubRequest<'a> {
        HubRequest {
            repo: &self.repo,
            revision: &self.revision,
            env: &self.env,
            progress: opts.progress,
        }
    }
}

/// The repo id SOURCE names, when it is one: not an existing local path, and shaped like
/// `org/name` (`^[A-Za-z0-9][\w.-]*/[\w.-]+$`).
pub(crate) fn repo_id(source: &Path) -> Option<String> {
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

/// What the hub's requests need: the repo, its revision, the environment and the download bars.
#[derive(Debug, Clone)]
pub(crate) struct HubRequest<'a> {
    pub(crate) repo: &'a str,
    pub(crate) revision: &'a str,
    pub(crate) env: &'a HubEnv,
    pub(crate) progress: &'a DownloadProgress,
}

impl Remote for Hub {
    /// A repo id becomes a cache snapshot holding what is needed, downloading what is missing
    /// (unless offline), resolved as vLLM would.
    fn resolve(&self, opts: &FetchOptions, want: Want) -> Result<(Resolved, bool), ResolveError> {
        let req = &self.request(opts);
        let repo_dir = req.env.cache_dir.join(folder_name(req.repo));
        let (state, note) = find_state(req, &repo_dir)?;
        let snapshot = cache::snapshot_dir(&repo_dir, &state.commit);
        let why = match &note {
            Some(n) => Some(Why::Unreachable(n.clone())),
            None if req.env.offline => Some(Why::Offline),
            None => None,
        };
        let mut snap = HubSnapshot {
            req,
            repo_dir: &repo_dir,
            snapshot: &snapshot,
            listing: state.listing(),
            fetcher: Fetcher::new(req, &repo_dir, &snapshot, &state.commit, why),
            got: headers::Got::default(),
        };
        let (mut resolved, pre_sharded) = needed::select_and_fetch(&mut snap, opts, want)?;
        let HubSnapshot { fetcher, got, .. } = snap;
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
        resolved.remote = Some(RemoteSource {
            repo: req.repo.to_string(),
            revision: req.revision.to_string(),
            commit: state.commit.clone(),
            cache_dir: req.env.cache_dir.clone(),
            offline: state.source != StateSource::Hub && !fetcher.asked_hub() && !got.asked,
            snapshot,
            downloaded,
            note,
            fetched,
        });
        resolved.headers = std::sync::Arc::new(got.headers);
        Ok((resolved, pre_sharded))
    }
}

/// One commit of the repo in the cache: its files, and the fetcher that fills its snapshot.
struct HubSnapshot<'a> {
    req: &'a HubRequest<'a>,
    repo_dir: &'a Path,
    snapshot: &'a Path,
    listing: Listing,
    fetcher: Fetcher<'a>,
    /// The headers fetched alone.
    got: headers::Got,
}

impl Snapshot for HubSnapshot<'_> {
    fn folder(&self) -> &Path {
        self.snapshot
    }

    fn listing(&self) -> &Listing {
        &self.listing
    }

    fn fetch(&mut self, files: &[String]) -> Result<(), ResolveError> {
        self.fetcher.ensure(files)
    }

    fn fetch_headers(&mut self, files: &[String]) -> Result<(), ResolveError> {
        let f = &self.fetcher;
        self.got = headers::get(
            self.req,
            self.repo_dir,
            self.snapshot,
            f.commit(),
            f.why(),
            files,
        )?;
        Ok(())
    }
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
        if weights.contains(name.as_str()) || needed::is_rank_file(name) {
            f.tensor_data_bytes += bytes;
        }
    }
    f.bytes = f.header_bytes + f.file_bytes;
    f
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
}
