//! Where fetched safetensors headers are kept, so that a second run needs no server: beside the
//! Hugging Face cache's own layout, in a folder no other tool reads, and never under a name that
//! huggingface_hub or vLLM would take for a complete file (`blobs/<etag>`, `snapshots/…`).
//!
//! - `wload-headers/blobs/<etag>`: a file's first `8 + N` bytes (its header), named by the
//!   blob's etag, its content identity, so that one header serves every commit that has the file.
//! - `wload-headers/commits/<commit>.json`: `{file: {etag, size}}` for the files of that commit
//!   whose header is kept, so that an offline run finds the etag (and the whole file's size, which
//!   validation checks offsets against) without asking the hub.
//!
//! Both are written to a temporary name and renamed into place, and read as every small file is
//! (a regular file, under a size cap: a named pipe or a link to /dev/zero can neither block a run
//! nor fill its memory). A kept header that cannot be read, or that does not hold a whole header,
//! is as if absent: it is fetched again (online) or named as not cached (offline). A commit record
//! that cannot be used is replaced online, and refused by name offline (it would otherwise pass
//! for "nothing kept", hiding why).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::HubError;
use super::http::{MAX_LISTING_BYTES, usable_etag};
use crate::checkpoint::MAX_HEADER_LEN;
use crate::small_file;

/// A kept header: which blob a file of a commit is, and that blob's size.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub(super) struct Entry {
    pub(super) etag: String,
    pub(super) size: u64,
}

/// The header cache of one repo.
pub(super) struct HeaderCache {
    dir: PathBuf,
}

impl HeaderCache {
    pub(super) fn new(repo_dir: &Path) -> HeaderCache {
        HeaderCache {
            dir: repo_dir.join("wload-headers"),
        }
    }

    pub(super) fn commit_path(&self, commit: &str) -> PathBuf {
        self.dir.join("commits").join(format!("{commit}.json"))
    }

    fn header_path(&self, etag: &str) -> PathBuf {
        self.dir.join("blobs").join(etag)
    }

    /// The files of `commit` whose header is kept: empty when no record is kept, `Err` (why, in
    /// words) when one is there but cannot be used — a named pipe, a device, a folder, more than
    /// [`MAX_LISTING_BYTES`], not wload's JSON — read as every other small file is, so that it
    /// can neither block nor fill memory. Entries whose etag could lead out of the folder are
    /// left out.
    pub(super) fn entries(&self, commit: &str) -> Result<BTreeMap<String, Entry>, String> {
        let path = self.commit_path(commit);
        if path.symlink_metadata().is_err() {
            return Ok(BTreeMap::new());
        }
        let bytes =
            small_file::read_at_most(&path, MAX_LISTING_BYTES).map_err(|e| e.to_string())?;
        let mut entries: BTreeMap<String, Entry> =
            serde_json::from_slice(&bytes).map_err(|e| format!("not wload's JSON: {e}"))?;
        entries.retain(|_, e| usable_etag(&e.etag));
        Ok(entries)
    }

    /// The kept header of blob `etag`, when it holds exactly a whole header.
    pub(super) fn header(&self, etag: &str) -> Option<Vec<u8>> {
        let bytes = small_file::read_at_most(&self.header_path(etag), 8 + MAX_HEADER_LEN).ok()?;
        let n = u64::from_le_bytes(*bytes.first_chunk::<8>()?);
        (bytes.len() as u64 == n.checked_add(8)?).then_some(bytes)
    }

    /// Keeps `bytes` (a whole header) as blob `etag`'s.
    pub(super) fn keep_header(&self, etag: &str, bytes: &[u8]) -> Result<(), HubError> {
        write_atomically(&self.header_path(etag), bytes)
    }

    /// Adds `new` to the record of `commit` (entries of another run kept).
    pub(super) fn record(
        &self,
        commit: &str,
        new: &BTreeMap<String, Entry>,
    ) -> Result<(), HubError> {
        if new.is_empty() {
            return Ok(());
        }
        // A record that cannot be used is replaced (renamed over), not merged with.
        let mut all = self.entries(commit).unwrap_or_default();
        all.extend(new.iter().map(|(k, v)| (k.clone(), v.clone())));
        let text = serde_json::to_vec_pretty(&all).expect("strings and numbers serialise");
        write_atomically(&self.commit_path(commit), &text)
    }
}

/// Writes `bytes` to a temporary file beside `path`, then renames it into place: a reader sees
/// the old file or the new one, never half of one.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), HubError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| HubError::Io { path, source }
    };
    let dir = path.parent().expect("a file under the cache");
    fs::create_dir_all(dir).map_err(io(dir))?;
    let name = path.file_name().expect("a file name").to_string_lossy();
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    fs::write(&tmp, bytes).map_err(io(&tmp))?;
    fs::rename(&tmp, path).map_err(io(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_headers_and_records_round_trip_and_partial_ones_are_absent() {
        let tmp = tempfile::TempDir::new().unwrap();
        let c = HeaderCache::new(tmp.path());
        let mut header = 4u64.to_le_bytes().to_vec();
        header.extend_from_slice(b"{}  ");
        c.keep_header("abc", &header).unwrap();
        assert_eq!(c.header("abc"), Some(header.clone()));
        // A header cut short is not a header.
        c.keep_header("cut", &header[..10]).unwrap();
        assert_eq!(c.header("cut"), None);
        assert_eq!(c.header("absent"), None);
        let e = |etag: &str| Entry {
            etag: etag.into(),
            size: 100,
        };
        c.record("c1", &BTreeMap::from([("a".to_string(), e("abc"))]))
            .unwrap();
        c.record("c1", &BTreeMap::from([("b".to_string(), e("../x"))]))
            .unwrap();
        let got = c.entries("c1").unwrap();
        assert_eq!(got.get("a"), Some(&e("abc")));
        // An etag that could lead out of the folder is dropped.
        assert!(!got.contains_key("b"));
        assert!(c.entries("other").unwrap().is_empty());
    }
}
