//! The Hugging Face cache as huggingface_hub lays it out, and what a revision is in it:
//! `<cache>/models--{org}--{name}/refs/<revision>` holds a commit hash, `snapshots/<commit>/<file>`
//! are relative symlinks to `blobs/<etag>`, and (wload's own record) `.wload/<commit>.json` keeps
//! the repo's file list at that commit.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::http::MAX_LISTING_BYTES;
use super::{HubError, HubRequest, Why};
use crate::resolve::LoadFormat;
use crate::resolve::local::{self, Listing};

/// `models--org--name`, as huggingface_hub names a model repo's cache folder.
pub(crate) fn folder_name(repo: &str) -> String {
    format!("models--{}", repo.replace('/', "--"))
}

/// `snapshots/<commit>`: the checkpoint folder of one commit.
pub(super) fn snapshot_dir(repo_dir: &Path, commit: &str) -> PathBuf {
    repo_dir.join("snapshots").join(commit)
}

/// A full commit hash, which a revision may be.
pub(super) fn is_commit(revision: &str) -> bool {
    revision.len() == 40 && revision.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Where a revision's files come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum StateSource {
    /// The hub's answer for the revision.
    Hub,
    /// The file list saved by an earlier run.
    Saved,
    /// The snapshot folder's own files (a cache written by another tool).
    Snapshot,
}

/// The commit a revision points to and the repo's files at that commit.
pub(super) struct State {
    pub(super) commit: String,
    pub(super) files: Vec<String>,
    pub(super) source: StateSource,
}

impl State {
    /// The files as a folder listing: top level and subfolders apart, each sorted.
    pub(super) fn listing(&self) -> Listing {
        let mut l = Listing::default();
        for f in &self.files {
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
}

/// The repo's file list as the hub gave it, kept in the cache (`.wload/<commit>.json` inside the
/// repo's folder, where huggingface_hub's own tools do not look) so that an offline run selects
/// from the same list as the online one.
#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
struct SavedListing {
    repo: String,
    commit: String,
    #[serde(deserialize_with = "super::capped::capped_strings")]
    files: Vec<String>,
}

fn listing_path(repo_dir: &Path, commit: &str) -> PathBuf {
    repo_dir.join(".wload").join(format!("{commit}.json"))
}

/// The file list an earlier run saved for `commit`: `None` when there is none, an error naming
/// the file and the limit when one is there and cannot be used (acting as if it were absent
/// would select from the snapshot's files instead, silently).
pub(super) fn saved_listing(
    repo_dir: &Path,
    commit: &str,
    why: &Why,
) -> Result<Option<Vec<String>>, HubError> {
    let path = listing_path(repo_dir, commit);
    if path.symlink_metadata().is_err() {
        return Ok(None);
    }
    let bad = |message: String| HubError::BadSavedListing {
        path: path.clone(),
        message,
        why: why.clone(),
    };
    let text = crate::small_file::read_at_most(&path, MAX_LISTING_BYTES)
        .map_err(|e| bad(e.to_string()))?;
    let saved: SavedListing =
        serde_json::from_slice(&text).map_err(|e| bad(format!("not wload's JSON: {e}")))?;
    if saved.commit != commit {
        return Err(bad(format!(
            "it is the list of commit '{}'",
            super::url::shown(&saved.commit)
        )));
    }
    Ok(Some(saved.files))
}

/// Records what the hub said about `revision`: its ref (as huggingface_hub does, for a branch or
/// tag and not for a commit) and the file list of its commit.
pub(super) fn record(
    repo_dir: &Path,
    repo: &str,
    revision: &str,
    state: &State,
) -> Result<(), HubError> {
    if revision != state.commit {
        write_atomic(
            &repo_dir.join("refs").join(revision),
            state.commit.as_bytes(),
        )?;
    }
    let listing = SavedListing {
        repo: repo.to_string(),
        commit: state.commit.clone(),
        files: state.files.clone(),
    };
    let text = serde_json::to_vec_pretty(&listing).expect("a listing serialises");
    write_atomic(&listing_path(repo_dir, &state.commit), &text)
}

/// The state of the cache alone: the ref (or the commit given), the snapshot, and the saved file
/// list or else the snapshot's files.
pub(super) fn cached_state(req: &HubRequest, repo_dir: &Path, why: Why) -> Result<State, HubError> {
    let not_cached = || HubError::NotCached {
        repo: req.repo.to_string(),
        revision: req.revision.to_string(),
        cache: req.env.cache_dir.clone(),
        why: why.clone(),
    };
    let commit = if is_commit(req.revision) {
        req.revision.to_string()
    } else {
        let path = repo_dir.join("refs").join(req.revision);
        // A ref is 40 bytes; a longer one is shown cut, and refused all the same.
        let text = match crate::small_file::read_at_most(&path, 4096) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(not_cached()),
            Err(e) if e.kind() == io::ErrorKind::FileTooLarge => b"(more than 4096 bytes)".to_vec(),
            Err(e) => return Err(HubError::Io { path, source: e }),
            Ok(t) => t,
        };
        let text = String::from_utf8_lossy(&text);
        let commit = text.trim();
        // Anything but a commit hash would name a folder elsewhere (`../../x`) as the snapshot.
        if !is_commit(commit) {
            return Err(HubError::BadRef {
                content: commit.to_string(),
                path,
                why,
            });
        }
        commit.to_string()
    };
    let snapshot = snapshot_dir(repo_dir, &commit);
    if !snapshot.is_dir() {
        return Err(not_cached());
    }
    if let Some(files) = saved_listing(repo_dir, &commit, &why)? {
        return Ok(State {
            commit,
            files,
            source: StateSource::Saved,
        });
    }
    Ok(State {
        files: snapshot_files(&snapshot)?,
        commit,
        source: StateSource::Snapshot,
    })
}

/// The snapshot's own files, plus those its indexes name: a shard the index lists but the cache
/// lacks is then reported as not cached, not as a broken checkpoint.
fn snapshot_files(snapshot: &Path) -> Result<Vec<String>, HubError> {
    let listing = local::list(snapshot).map_err(|(path, source)| HubError::Io { path, source })?;
    let mut files: Vec<String> = listing.all().map(str::to_string).collect();
    for index in [
        LoadFormat::Hf.index_file(),
        LoadFormat::Mistral.index_file(),
    ] {
        if listing.has_top(index)
            && let Ok(named) = crate::resolve::index::files_named(&snapshot.join(index))
        {
            files.extend(named);
        }
    }
    files.sort();
    files.dedup();
    Ok(files)
}

/// Refuses a cached file whose real path is outside the repo's `blobs/` and `snapshots/`: a
/// link there is huggingface_hub's (or wload's) only when it leads to a blob, or it is a plain
/// file of a cache written without links. Either folder may itself be a link (to another disk).
pub(super) fn check_inside(repo_dir: &Path, path: &Path) -> Result<(), HubError> {
    let real = fs::canonicalize(path).map_err(|source| HubError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let inside = ["blobs", "snapshots"]
        .iter()
        .any(|d| fs::canonicalize(repo_dir.join(d)).is_ok_and(|root| real.starts_with(root)));
    if inside {
        Ok(())
    } else {
        Err(HubError::LinkEscapes {
            path: path.to_path_buf(),
            target: real,
        })
    }
}

/// `snapshots/<commit>/<file>` → `../../blobs/<etag>` (one more `..` per folder in `file`).
pub(super) fn link(snapshot: &Path, file: &str, etag: &str) -> Result<(), HubError> {
    let link = snapshot.join(file);
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
