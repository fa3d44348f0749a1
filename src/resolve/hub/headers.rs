//! Header-only weight files: for `inspect`, `plan`, `sizes` and `load --dry-run`, which read no
//! tensor data, only the safetensors header of each selected weight file is fetched, with HTTP
//! `Range` requests, as huggingface_hub's `get_safetensors_metadata` does: one speculative range
//! of the first [`SPECULATIVE`] bytes, then, when the header is longer, a second range for the
//! rest. The file's size comes from the file's metadata (`X-Linked-Size`) and must agree with the
//! answer's `Content-Range`; validation then checks the header against it exactly as a local
//! file's (`checkpoint::read_remote_header`).
//!
//! A server that ignores `Range` (200 and the whole file) is read only as far as the header goes
//! and the connection dropped: never more than the header and what the socket already holds.
//!
//! A file the cache already holds whole is used as it is (nothing is fetched); a header fetched
//! before is taken from the header cache ([`super::header_cache`]). The requests have the
//! downloader's timeouts, retries, token policy and redirect rules (they go through the same
//! [`Client`]).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::cache;
use super::download::{pinned_metadata, retried};
use super::error::http_error;
use super::header_cache::{Entry, HeaderCache};
use super::http::{Client, Follow, HttpError, Meta, parse_content_range, refuse_encoded};
use super::{HubError, HubRequest, Origin, Why};
use crate::checkpoint::{RemoteHeader, check_prefix};
use crate::resolve::ResolveError;

/// The first range asked for: most headers fit (huggingface_hub asks for 100,000 bytes too).
pub(super) const SPECULATIVE: u64 = 100_000;

/// Header requests at once: each is a round trip or two of little data.
const PARALLEL: usize = 8;

/// The weight files' headers, as far as they were not on disk.
#[derive(Default)]
pub(super) struct Got {
    /// The files that have only their header, by name.
    pub(super) headers: BTreeMap<String, RemoteHeader>,
    pub(super) origins: BTreeMap<String, Origin>,
    /// Bytes read from header answers, and of how many files.
    pub(super) bytes: u64,
    pub(super) files: usize,
    /// Whether the hub was asked anything.
    pub(super) asked: bool,
}

/// One file's outcome.
enum One {
    /// On disk, whole (already, or linked from a blob the cache holds).
    Local,
    /// Its header, fetched (`fetched` bytes read for it) or kept from an earlier run.
    Header {
        header: RemoteHeader,
        fetched: Option<u64>,
        entry: Entry,
    },
}

/// Gets the header of each of `files` (weight files of the snapshot), from disk, the header
/// cache or the hub (unless `why` forbids asking it).
pub(super) fn get(
    req: &HubRequest,
    repo_dir: &Path,
    snapshot: &Path,
    commit: &str,
    why: Option<&Why>,
    files: &[String],
) -> Result<Got, ResolveError> {
    let kept = HeaderCache::new(repo_dir);
    // A record that cannot be used is as if absent online (the headers are fetched again and
    // the record rewritten), and refused by name offline, where it is the reason.
    let (entries, bad_record) = match kept.entries(commit) {
        Ok(e) => (e, None),
        Err(message) => (BTreeMap::new(), Some(message)),
    };
    let mut got = Got::default();
    let mut missing = Vec::new();
    for f in files {
        let path = snapshot.join(f);
        if path.is_file() {
            cache::check_inside(repo_dir, &path)?;
            got.origins.insert(f.clone(), Origin::Cache);
            continue;
        }
        let entry = entries.get(f);
        match entry.and_then(|e| Some((e, kept.header(&e.etag)?))) {
            Some((e, bytes)) => {
                got.origins.insert(f.clone(), Origin::CachedHeader);
                got.headers
                    .insert(f.clone(), remote(f, &path, e.clone(), bytes));
            }
            None => missing.push(f.clone()),
        }
    }
    if missing.is_empty() {
        return Ok(got);
    }
    if let Some(why) = why {
        if let Some(message) = bad_record {
            return Err(HubError::BadHeaderRecord {
                path: kept.commit_path(commit),
                message,
                why: why.clone(),
            }
            .into());
        }
        return Err(HubError::FilesNotCached {
            repo: req.repo.to_string(),
            revision: req.revision.to_string(),
            snapshot: snapshot.to_path_buf(),
            files: missing,
            why: why.clone(),
        }
        .into());
    }
    got.asked = true;
    let asker = Asker {
        req,
        client: Client::new(req.env),
        repo_dir,
        snapshot,
        commit,
        kept: &kept,
    };
    let outcomes = asker.all(&missing)?;
    let mut new = BTreeMap::new();
    for (f, one) in missing.into_iter().zip(outcomes) {
        match one {
            One::Local => {
                got.origins.insert(f, Origin::Cache);
            }
            One::Header {
                header,
                fetched,
                entry,
            } => {
                got.origins.insert(
                    f.clone(),
                    fetched.map_or(Origin::CachedHeader, |_| Origin::Header),
                );
                if let Some(n) = fetched {
                    got.bytes += n;
                    got.files += 1;
                }
                new.insert(f.clone(), entry);
                got.headers.insert(f, header);
            }
        }
    }
    kept.record(commit, &new)?;
    Ok(got)
}

fn remote(name: &str, path: &Path, entry: Entry, bytes: Vec<u8>) -> RemoteHeader {
    RemoteHeader {
        name: name.to_string(),
        path: path.to_path_buf(),
        size: entry.size,
        bytes,
        etag: entry.etag,
        readable: false,
    }
}

/// Asks the hub for headers.
struct Asker<'a> {
    req: &'a HubRequest<'a>,
    client: Client,
    repo_dir: &'a Path,
    snapshot: &'a Path,
    commit: &'a str,
    kept: &'a HeaderCache,
}

impl Asker<'_> {
    /// Each of `files`, a few at a time; the first failure in file order is returned.
    fn all(&self, files: &[String]) -> Result<Vec<One>, HubError> {
        let next = AtomicUsize::new(0);
        let results: Mutex<BTreeMap<usize, Result<One, HubError>>> = Mutex::new(BTreeMap::new());
        std::thread::scope(|s| {
            for _ in 0..PARALLEL.min(files.len()) {
                s.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= files.len() {
                            break;
                        }
                        let r = self.one(&files[i]);
                        let failed = r.is_err();
                        results.lock().expect("not poisoned").insert(i, r);
                        if failed {
                            next.store(files.len(), Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        let results = results.into_inner().expect("not poisoned");
        results.into_values().collect()
    }

    /// One file: its metadata (pinned to the commit), then the blob when the cache holds it
    /// whole, the kept header of the same blob, or its header from the hub.
    fn one(&self, file: &str) -> Result<One, HubError> {
        let client = &self.client;
        let url = client.file_url(self.req.repo, self.commit, file);
        let fail = |e| http_error(self.req, Some(file), self.commit, e);
        let meta = pinned_metadata(client, &url, self.req, self.commit, file)?;
        let blob = self.repo_dir.join("blobs").join(&meta.etag);
        if std::fs::metadata(&blob).is_ok_and(|m| m.is_file() && m.len() == meta.size) {
            cache::link(self.snapshot, file, &meta.etag)?;
            return Ok(One::Local);
        }
        let entry = Entry {
            etag: meta.etag.clone(),
            size: meta.size,
        };
        let path = self.snapshot.join(file);
        if let Some(bytes) = self.kept.header(&meta.etag) {
            let header = remote(file, &path, entry.clone(), bytes);
            return Ok(One::Header {
                header,
                fetched: None,
                entry,
            });
        }
        let mut fetched = 0;
        // Bytes of a try that failed were fetched all the same: they count.
        let bytes = retried(|| fetch_header(client, &url, &meta, &path, &mut fetched))
        .map_err(|e| match e {
            HttpError::Timeout(limit) => HubError::Download {
                repo: self.req.repo.to_string(),
                file: file.to_string(),
                message: format!(
                    "nothing came for {} s ({}) while its header was fetched; set {} higher on a slow link",
                    limit.secs, limit.var, limit.var
                ),
            },
            e => fail(e),
        })?;
        // Only a whole header is kept; one the checks will refuse is not.
        if check_prefix(&path, meta.size, &bytes).is_ok_and(|n| bytes.len() as u64 == 8 + n) {
            self.kept.keep_header(&meta.etag, &bytes)?;
        }
        Ok(One::Header {
            header: remote(file, &path, entry.clone(), bytes),
            fetched: Some(fetched),
            entry,
        })
    }
}

/// The file's first `8 + N` bytes (or, when its length `N` is refused, as many as were read to
/// find that out), counting in `fetched` every byte read from the answers.
fn fetch_header(
    client: &Client,
    url: &str,
    meta: &Meta,
    path: &Path,
    fetched: &mut u64,
) -> Result<Vec<u8>, HttpError> {
    if meta.size < 8 {
        // Nothing to ask: the checks refuse the file by its size alone.
        return Ok(Vec::new());
    }
    let (mut bytes, rest) = ranged(client, url, meta, 0, SPECULATIVE.min(meta.size), fetched)?;
    let Ok(n) = check_prefix(path, meta.size, &bytes) else {
        return Ok(bytes);
    };
    let want = 8 + n;
    let have = bytes.len() as u64;
    if want <= have {
        bytes.truncate(want as usize);
        return Ok(bytes);
    }
    match rest {
        // The server sends the whole file: read on, as far as the header goes.
        Some(mut body) => {
            let more = read_n(&mut body, want - have, client, fetched)?;
            bytes.extend_from_slice(&more);
        }
        None => {
            let (more, _) = ranged(client, url, meta, have, want, fetched)?;
            bytes.extend_from_slice(&more);
        }
    }
    Ok(bytes)
}

/// The unread rest of a 200 answer's body.
type Rest = Box<dyn Read + Send>;

/// Bytes `from..to` of the file: a 206 that must be exactly that range of a file of
/// `meta.size`, or a 200 (the range ignored) whose first `from` bytes are read past; then the
/// rest of the 200's body, unread, to read on from.
fn ranged(
    client: &Client,
    url: &str,
    meta: &Meta,
    from: u64,
    to: u64,
    fetched: &mut u64,
) -> Result<(Vec<u8>, Option<Rest>), HttpError> {
    let size = meta.size;
    let range = format!("bytes={from}-{}", to - 1);
    let response = client.send(url, false, Some(&range), client.download, Follow::All)?;
    refuse_encoded(&response)?;
    let status = response.status().as_u16();
    let announced = response.body().content_length();
    match status {
        206 => {
            let value = response
                .headers()
                .get("Content-Range")
                .map(|v| String::from_utf8_lossy(v.as_bytes()).trim().to_string());
            let ok = value.as_deref().and_then(parse_content_range)
                == Some((from, to - 1, Some(size)))
                && announced.is_none_or(|n| n == to - from);
            if !ok {
                return Err(HttpError::Invalid(format!(
                    "asked for the header's bytes {from}-{} of the file's {size} (per its {}), the answer (HTTP 206) has {}{}",
                    to - 1,
                    meta.size_from,
                    match &value {
                        Some(v) => format!("Content-Range '{}'", super::url::shown(v)),
                        None => "no Content-Range".to_string(),
                    },
                    announced.map_or_else(String::new, |n| format!(" and Content-Length {n}")),
                )));
            }
            let mut body = response.into_body().into_reader();
            Ok((read_n(&mut body, to - from, client, fetched)?, None))
        }
        200 => {
            if let Some(n) = announced.filter(|n| *n != size) {
                return Err(HttpError::Invalid(format!(
                    "the answer (HTTP 200, the whole file) announces {n} bytes (Content-Length) where the file has {size} ({})",
                    meta.size_from
                )));
            }
            let mut body: Rest = Box::new(response.into_body().into_reader());
            read_n(&mut body, from, client, fetched)?;
            let bytes = read_n(&mut body, to - from, client, fetched)?;
            Ok((bytes, Some(body)))
        }
        s => Err(HttpError::Invalid(format!(
            "the answer to a header request is HTTP {s}, neither 200 nor 206"
        ))),
    }
}

/// Exactly `n` bytes of `body` (at most [`crate::checkpoint::MAX_HEADER_LEN`] and a bit: the
/// callers checked the length first), counted in `fetched`.
fn read_n(
    body: &mut dyn Read,
    n: u64,
    client: &Client,
    fetched: &mut u64,
) -> Result<Vec<u8>, HttpError> {
    let mut out = Vec::with_capacity(n as usize);
    let read = body.take(n).read_to_end(&mut out);
    *fetched += out.len() as u64;
    let got = read.map_err(|e| HttpError::from_io(e, client.download))?;
    if (got as u64) < n {
        return Err(HttpError::Transport(format!(
            "the answer ended after {got} of the {n} bytes asked for"
        )));
    }
    Ok(out)
}
