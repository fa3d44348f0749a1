//! Object storage as SOURCE (`s3://bucket/prefix`, `gs://…`, `az://…`), through the
//! `object_store` crate. A store source is a remote ([`Remote`]) like the hub, with one
//! difference: its weight files are never downloaded. Selection runs over the store's listing;
//! the config, the index and (for `shard`) the side files are fetched whole into a local cache
//! folder; of each selected weight file only the safetensors header is fetched, by ranged GETs,
//! and its tensor data stays in the store, read by the engine in exactly the planned ranges
//! ([`data`]), each checked against the etag the listing gave.
//!
//! A pre-sharded folder in a store (`wload load s3://…/model-tp4`) has its rank files fetched
//! whole: the loader reads them as local files.

pub(crate) mod client;
pub(crate) mod data;
pub(crate) mod error;
pub(crate) mod mirror;
pub(crate) mod node_cache;
pub(crate) mod url;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::local::Listing;
use super::remote::{FetchOptions, Fetched, Origin, Remote, RemoteSource, Snapshot, needed};
use super::{ResolveError, Resolved, Want};
use crate::checkpoint::RemoteHeader;
use client::{Listed, Store};
pub use error::StoreError;
pub use url::Scheme;
use url::StoreUrl;

/// SOURCE as an object-store folder.
#[derive(Debug)]
pub(crate) struct ObjectSource {
    url: StoreUrl,
    /// Where its small files are kept (`--download-dir`, or wload's cache folder).
    cache_root: PathBuf,
}

impl ObjectSource {
    /// `source` as an object-store URL: `Ok(None)` when it is none.
    pub(crate) fn parse(
        source: &Path,
        download_dir: Option<&Path>,
    ) -> Result<Option<ObjectSource>, String> {
        let Some(url) = StoreUrl::parse(&source.to_string_lossy())? else {
            return Ok(None);
        };
        let cache_root = match download_dir {
            Some(d) => d.to_path_buf(),
            None => default_cache()?,
        };
        Ok(Some(ObjectSource { url, cache_root }))
    }

    fn folder(&self) -> PathBuf {
        let mut p = self
            .cache_root
            .join("objects")
            .join(&self.url.written)
            .join(&self.url.bucket);
        for c in self.url.prefix.split('/').filter(|c| !c.is_empty()) {
            p.push(c);
        }
        p
    }
}

/// `$XDG_CACHE_HOME/wload`, else `~/.cache/wload`.
fn default_cache() -> Result<PathBuf, String> {
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|x| !x.is_empty()) {
        return Ok(PathBuf::from(x).join("wload"));
    }
    match std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        Some(h) => Ok(PathBuf::from(h).join(".cache").join("wload")),
        None => Err(
            "neither XDG_CACHE_HOME nor HOME is set: pass --download-dir for the folder where an \
             object-store source's config and headers are kept"
                .into(),
        ),
    }
}

impl Remote for ObjectSource {
    fn resolve(&self, opts: &FetchOptions, want: Want) -> Result<(Resolved, bool), ResolveError> {
        let store = Store::open(&self.url)?;
        let objects = store.list()?;
        if objects.is_empty() {
            return Err(StoreError::Empty {
                url: self.url.to_string(),
                hint: String::new(),
            }
            .into());
        }
        let ranks: Vec<&str> = (objects.iter())
            .map(|o| o.name.as_str())
            .filter(|n| !n.contains('/') && needed::is_rank_file(n))
            .collect();
        if want == Want::Checkpoint && !ranks.is_empty() {
            return Err(StoreError::PreSharded {
                url: self.url.to_string(),
                files: format!(
                    "{} file{}",
                    ranks.len(),
                    crate::units::plural(ranks.len() as u64)
                ),
            }
            .into());
        }
        let folder = self.folder();
        std::fs::create_dir_all(&folder).map_err(|source| ResolveError::Io {
            path: folder.clone(),
            source,
        })?;
        let mut snap = StoreSnapshot {
            store: &store,
            folder: folder.clone(),
            listing: listing_of(&objects),
            objects: objects
                .iter()
                .map(|o| (o.name.clone(), o.clone()))
                .collect(),
            headers: BTreeMap::new(),
            origins: BTreeMap::new(),
            fetched: Fetched {
                from: self.url.to_string(),
                ..Fetched::default()
            },
        };
        let (mut resolved, pre_sharded) = needed::select_and_fetch(&mut snap, opts, want)?;
        // Weight files the command will read, whose headers `fetch` took: the same as
        // `fetch_headers`'s, but readable.
        for f in &mut resolved.files {
            f.origin = snap.origins.get(&f.file).copied();
        }
        for (name, h) in &snap.headers {
            data::register(
                folder.join(name),
                data::ObjectData {
                    store: store.clone(),
                    name: name.clone(),
                    etag: h.etag.clone(),
                    size: h.size,
                },
            );
        }
        snap.fetched.bytes = snap.fetched.header_bytes + snap.fetched.file_bytes;
        resolved.remote = Some(RemoteSource {
            repo: self.url.to_string(),
            revision: String::new(),
            commit: identity(&objects),
            cache_dir: self.cache_root.clone(),
            snapshot: folder,
            offline: false,
            downloaded: snap.fetched.files.clone(),
            note: None,
            fetched: snap.fetched,
        });
        resolved.headers = std::sync::Arc::new(snap.headers);
        Ok((resolved, pre_sharded))
    }
}

/// The folder's identity as listed: its objects' names, sizes and etags, hashed. What the run
/// record keeps as the "commit" of a store source.
fn identity(objects: &[Listed]) -> String {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    for o in objects {
        h.update(o.name.as_bytes());
        h.update(&o.size.to_le_bytes());
        h.update(o.etag.as_bytes());
        h.update(&[0]);
    }
    format!("{:016x}", h.digest())
}

/// The store's objects as a folder listing: top-level names and nested paths. Keys with empty,
/// `.` or `..` segments name nothing a folder could hold, and are left out.
fn listing_of(objects: &[Listed]) -> Listing {
    let mut l = Listing {
        top: Vec::new(),
        nested: Vec::new(),
        unreadable: Vec::new(),
    };
    for o in objects {
        if o.name
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..")
        {
            continue;
        }
        if o.name.contains('/') {
            l.nested.push(o.name.clone());
        } else {
            l.top.push(o.name.clone());
        }
    }
    l
}

struct StoreSnapshot<'a> {
    store: &'a Store,
    folder: PathBuf,
    listing: Listing,
    objects: BTreeMap<String, Listed>,
    headers: BTreeMap<String, RemoteHeader>,
    origins: BTreeMap<String, Origin>,
    fetched: Fetched,
}

impl StoreSnapshot<'_> {
    fn listed(&self, name: &str) -> Result<&Listed, ResolveError> {
        self.objects.get(name).ok_or_else(|| {
            StoreError::NotFound {
                url: self.store.url.child(name),
                op: "resolving",
            }
            .into()
        })
    }

    /// Downloads `name` whole into the folder (a temporary file renamed into place, so that
    /// another process reading the folder never sees half a file).
    fn download(&mut self, name: &str) -> Result<(), ResolveError> {
        let listed = self.listed(name)?.clone();
        let (bytes, etag) = self.store.get(name)?;
        if !listed.etag.is_empty() && !etag.is_empty() && etag != listed.etag {
            return Err(StoreError::Changed {
                url: self.store.url.child(name),
                planned: listed.etag,
                now: etag,
            }
            .into());
        }
        let path = self.folder.join(name);
        let io = |source| ResolveError::Io {
            path: path.clone(),
            source,
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let tmp = path.with_file_name(format!(
            ".{}.{}.part",
            path.file_name().unwrap_or_default().to_string_lossy(),
            std::process::id()
        ));
        let mut f = std::fs::File::create(&tmp).map_err(io)?;
        f.write_all(&bytes).map_err(io)?;
        drop(f);
        std::fs::rename(&tmp, &path).map_err(io)?;
        self.fetched.files.push(name.to_string());
        self.fetched.file_bytes += bytes.len() as u64;
        if needed::is_rank_file(name) {
            self.fetched.tensor_data_bytes += bytes.len() as u64;
        }
        Ok(())
    }

    /// Fetches the safetensors headers alone of `names`, in parallel: the 8-byte length, then
    /// exactly the header (two small ranged GETs each: the store sends nothing else).
    fn headers(&mut self, names: &[String]) -> Result<(), ResolveError> {
        use rayon::prelude::*;
        let listed: Vec<Listed> = (names.iter())
            .map(|n| self.listed(n).cloned())
            .collect::<Result<_, _>>()?;
        let store = self.store;
        let got: Vec<Result<(Vec<u8>, String), StoreError>> = listed
            .par_iter()
            .with_max_len(1)
            .map(|l| header_bytes(store, l))
            .collect();
        for (l, bytes) in listed.into_iter().zip(got) {
            let (bytes, etag) = bytes?;
            self.fetched.header_bytes += bytes.len() as u64;
            self.fetched.header_files += 1;
            self.origins.insert(l.name.clone(), Origin::Header);
            self.headers.insert(
                l.name.clone(),
                RemoteHeader {
                    name: l.name.clone(),
                    path: self.folder.join(&l.name),
                    size: l.size,
                    bytes,
                    etag,
                    readable: true,
                },
            );
        }
        Ok(())
    }
}

/// A weight file's first `8 + N` bytes: its length prefix and header, or as much as there is
/// when the length is refused (`checkpoint::check_prefix` then says why, with the numbers); and
/// the etag the file is planned with: the listing's, else (some S3-compatible stores list none)
/// the one the first GET answered with, so that a file replaced later is still refused.
fn header_bytes(store: &Store, l: &Listed) -> Result<(Vec<u8>, String), StoreError> {
    let listed = Some(l.etag.as_str()).filter(|e| !e.is_empty());
    let (first, answered) = store.get_range_tagged(&l.name, 0..l.size.min(8), listed)?;
    let etag = listed.map_or(answered, str::to_string);
    let mut bytes = first.to_vec();
    if let Some(len) = bytes.first_chunk::<8>().map(|b| u64::from_le_bytes(*b)) {
        let end = 8u64.saturating_add(len);
        if end <= l.size && len <= crate::checkpoint::MAX_HEADER_LEN && len > 0 {
            bytes.extend_from_slice(&store.get_range(&l.name, 8..end, Some(&etag))?);
        }
    }
    Ok((bytes, etag))
}

impl Snapshot for StoreSnapshot<'_> {
    fn folder(&self) -> &Path {
        &self.folder
    }

    fn listing(&self) -> &Listing {
        &self.listing
    }

    fn fetch(&mut self, files: &[String]) -> Result<(), ResolveError> {
        let (weights, whole): (Vec<String>, Vec<String>) = files.iter().cloned().partition(|f| {
            crate::resolve::select::weight_kind(&f.to_ascii_lowercase()).is_some()
                && !needed::is_rank_file(f)
        });
        for f in &whole {
            // The config is asked for as itself and again as a side file.
            if self.fetched.files.contains(f) {
                continue;
            }
            self.download(f)?;
        }
        self.headers(&weights)
    }

    fn fetch_headers(&mut self, files: &[String]) -> Result<(), ResolveError> {
        self.headers(files)
    }
}
