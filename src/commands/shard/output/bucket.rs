//! OUT in object storage (`-o s3://bucket/prefix`): built in a local staging folder as a folder
//! OUT is, then published by uploading it so that nothing is visible under OUT before every
//! byte of every file has arrived. Each large file is a multipart upload whose parts all go up
//! first; the uploads are completed (and the small files put) only then, and the run record —
//! `wload.json`, or a `--ranks` run's `wload-ranks-*.json` — last. A run that fails or is
//! stopped before that aborts its uploads: the store drops their parts and no object appears.
//!
//! What may be under OUT already, as for a folder: nothing; with `--force`, an earlier wload
//! output (every object named by its records), of which only what the new output does not
//! overwrite and the records list is deleted, after publication; for a `--ranks` run, the
//! outputs of other `--ranks` runs of the same plan (several machines, one OUT), whose records
//! are compared with this run's before anything is uploaded.

use std::collections::BTreeSet;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::Value;

use super::{Publish, Staging, Swept};
use crate::commands::error::shard::{Entries, OutProblem};
use crate::commands::shard::ShardError;
use crate::commands::shard::space::{self, Space};
use crate::resolve::store::client::{Listed, Store};
use crate::resolve::store::error::StoreError;
use crate::resolve::store::url::StoreUrl;
use crate::sharded::runs;

/// Bytes per uploaded part (S3 takes 5 MiB to 5 GiB), and parts in flight: 64 MiB of memory.
const PART: usize = 8 << 20;
const IN_FLIGHT: usize = 8;

/// The run record of a run of all ranks.
const MANIFEST: &str = "wload.json";

/// An OUT in object storage.
pub(in crate::commands::shard) struct Bucket<'a> {
    pub(in crate::commands::shard) url: StoreUrl,
    /// As the user wrote it, for messages.
    pub(in crate::commands::shard) out: &'a Path,
    /// A `--ranks` run: other runs' outputs of the same plan may be there.
    pub(in crate::commands::shard) split: bool,
    pub(in crate::commands::shard) cancel: &'a AtomicBool,
}

/// What was under OUT when the run began.
pub(in crate::commands::shard) struct Found {
    store: Store,
    objects: Vec<Listed>,
    /// Records already there (`wload.json`, `wload-ranks-*.json`), parsed.
    records: Vec<(String, Value)>,
    force: bool,
}

fn is_record(name: &str) -> bool {
    name == MANIFEST || runs::is_record(name)
}

impl<'a> Bucket<'a> {
    /// OUT as an object-store folder, when it is a URL.
    pub(in crate::commands::shard) fn of(
        opts: &'a crate::commands::shard::ShardOptions,
        cancel: &'a AtomicBool,
    ) -> Result<Option<Bucket<'a>>, ShardError> {
        let text = opts.out.to_string_lossy();
        let url = crate::resolve::store::url::StoreUrl::parse(&text)
            .map_err(crate::resolve::store::StoreError::Url)?;
        Ok(url.map(|url| Bucket {
            url,
            out: &opts.out,
            split: opts.ranks.is_some(),
            cancel,
        }))
    }

    fn refuse(&self, problem: OutProblem) -> ShardError {
        ShardError::Out {
            path: self.out.to_path_buf(),
            problem,
        }
    }

    /// Every name the records there list: part files, side files, config.json, the records.
    fn owned(records: &[(String, Value)]) -> BTreeSet<String> {
        let mut owned = BTreeSet::new();
        for (name, r) in records {
            owned.insert(name.clone());
            owned.insert("config.json".to_string());
            for key in ["files", "side_files"] {
                for f in r.get(key).and_then(Value::as_array).into_iter().flatten() {
                    let n = f.as_str().or_else(|| f.get("name").and_then(Value::as_str));
                    owned.extend(n.map(str::to_string));
                }
            }
        }
        owned
    }
}

/// Whether `name` is under one of `owned` (itself, or inside a side folder it names).
fn covered(owned: &BTreeSet<String>, name: &str) -> bool {
    owned.contains(name)
        || (owned.iter()).any(|o| {
            name.strip_prefix(o.as_str())
                .is_some_and(|r| r.starts_with('/'))
        })
}

impl Publish for Bucket<'_> {
    type Checked = Found;

    fn check(&self, force: bool, _source: &Path) -> Result<Found, ShardError> {
        let store = Store::open(&self.url)?;
        let objects = store.list()?;
        let mut records = Vec::new();
        for o in objects.iter().filter(|o| is_record(&o.name)) {
            let (bytes, _) = store.get(&o.name)?;
            let v: Value = serde_json::from_slice(&bytes).map_err(|_| {
                self.refuse(OutProblem::NotOurs(Entries::new(vec![o.name.clone()])))
            })?;
            records.push((o.name.clone(), v));
        }
        if !objects.is_empty() {
            if records.is_empty() {
                let names = objects.iter().map(|o| o.name.clone()).collect();
                return Err(self.refuse(OutProblem::NotOurs(Entries::new(names))));
            }
            let owned = Bucket::owned(&records);
            let foreign: Vec<String> = (objects.iter())
                .filter(|o| !covered(&owned, &o.name))
                .map(|o| o.name.clone())
                .collect();
            if !foreign.is_empty() {
                return Err(self.refuse(OutProblem::Foreign(Entries::new(foreign))));
            }
            if !self.split && !force {
                return Err(ShardError::OutExists(self.out.to_path_buf()));
            }
        }
        Ok(Found {
            store,
            objects,
            records,
            force,
        })
    }

    fn sweep(&self) -> Vec<Swept> {
        Vec::new()
    }

    fn stage(
        &self,
        _found: &Found,
        (bytes, files): (u64, u64),
    ) -> Result<(Staging, Space), ShardError> {
        let tmp = std::env::temp_dir();
        let space = space::check(&tmp, &tmp, bytes, files, false)?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let path = tmp.join(format!(".wload-upload-{}-{nanos}", std::process::id()));
        fs::create_dir(&path)
            .map_err(|e| ShardError::io("creating the upload staging folder", &path, e))?;
        Ok((
            Staging {
                path,
                published: false,
            },
            space,
        ))
    }

    fn publish(&self, staging: Staging, found: &Found) -> Result<bool, ShardError> {
        let files = staged_files(staging.path())?;
        let (records, data): (Vec<_>, Vec<_>) = files.into_iter().partition(|(n, _)| is_record(n));
        self.same_plan(&records, found)?;
        if self.split && !found.force {
            let ours: BTreeSet<&str> = records.iter().map(|(n, _)| n.as_str()).collect();
            if let Some(o) = found
                .objects
                .iter()
                .find(|o| ours.contains(o.name.as_str()))
            {
                return Err(ShardError::OutExists(PathBuf::from(
                    found.store.url.child(&o.name),
                )));
            }
        }
        let mut up = Uploads::new(&found.store, self.cancel);
        let result = up.all(&data).and_then(|()| up.complete());
        if let Err(e) = result {
            up.abort();
            return Err(e);
        }
        for (name, path) in &records {
            let bytes = fs::read(path).map_err(|e| ShardError::io("reading", path, e))?;
            found.store.put(name, bytes.into())?;
        }
        let completed = self.split && self.complete(&found.store)?;
        // Replaced: what the old records listed and this output did not overwrite.
        if found.force && !self.split {
            let new: BTreeSet<&str> = data
                .iter()
                .chain(&records)
                .map(|(n, _)| n.as_str())
                .collect();
            for o in found
                .objects
                .iter()
                .filter(|o| !new.contains(o.name.as_str()))
            {
                found.store.delete(&o.name)?;
            }
        }
        drop(staging);
        Ok(completed)
    }
}

impl Bucket<'_> {
    /// After this run's record is up: when the `--ranks` runs' records under OUT now cover every
    /// rank of their plan, and every file they list is there at its size, their merged manifest
    /// as `wload.json`, so that the prefix reads as one finished output (to `wload`, and to
    /// whoever checks for `wload.json` before serving). Every run does this after putting its
    /// own record: the store reads its own writes, so the last run to finish sees all records,
    /// and runs that finish together write the same bytes (the merge goes by record name).
    /// A `wload.json` already there with other contents (a whole run's, from another source
    /// path) describes the same files and is left as it is.
    fn complete(&self, store: &Store) -> Result<bool, ShardError> {
        let objects = store.list()?;
        let mut records = Vec::new();
        let mut existing = None;
        for o in objects.iter().filter(|o| is_record(&o.name)) {
            let (bytes, _) = store.get(&o.name)?;
            match o.name == MANIFEST {
                true => existing = Some(bytes),
                false => records.push((o.name.clone(), Ok(bytes.to_vec()))),
            }
        }
        let Some(manifest) = runs::completed(self.out, records) else {
            return Ok(false);
        };
        let there =
            |name: &str, size: u64| objects.iter().any(|o| o.name == name && o.size == size);
        if !manifest.files.iter().all(|f| there(&f.name, f.size)) {
            return Ok(false);
        }
        let bytes = manifest.to_json().into_bytes();
        match existing {
            Some(e) => Ok(e.as_ref() == bytes.as_slice()),
            None => {
                store.put(MANIFEST, bytes.into())?;
                Ok(true)
            }
        }
    }
}

/// Keys of a run record that differ between runs of one plan: which ranks, their files, where
/// the source and OUT were.
const PER_RUN: &[&str] = &[
    "ranks",
    "files",
    "serve",
    "source",
    "side_files",
    "side_tree",
    "records",
    "config_changes",
];

impl Bucket<'_> {
    /// A `--ranks` run into OUT holding other runs' outputs: each of their records must be of
    /// this run's plan (the same checkpoint, model, layout and flags), else this run is refused
    /// before anything is uploaded.
    fn same_plan(&self, records: &[(String, PathBuf)], found: &Found) -> Result<(), ShardError> {
        if !self.split {
            return Ok(());
        }
        let Some((_, mine)) = records.first() else {
            return Ok(());
        };
        let mine: Value = serde_json::from_slice(
            &fs::read(mine).map_err(|e| ShardError::io("reading", mine, e))?,
        )
        .unwrap_or(Value::Null);
        for (name, theirs) in &found.records {
            let keys: BTreeSet<&String> = (mine.as_object().into_iter().flat_map(|m| m.keys()))
                .chain(theirs.as_object().into_iter().flat_map(|m| m.keys()))
                .collect();
            for k in keys.into_iter().filter(|k| !PER_RUN.contains(&k.as_str())) {
                if mine.get(k) != theirs.get(k) {
                    return Err(self.refuse(OutProblem::OtherPlan {
                        record: name.clone(),
                        key: k.clone(),
                        theirs: theirs.get(k).map_or("nothing".into(), Value::to_string),
                        ours: mine.get(k).map_or("nothing".into(), Value::to_string),
                    }));
                }
            }
        }
        Ok(())
    }
}

/// Every file of the staging folder, by name relative to it (`/`-separated), in name order.
fn staged_files(root: &Path) -> Result<Vec<(String, PathBuf)>, ShardError> {
    let mut out = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for e in fs::read_dir(&dir).map_err(|e| ShardError::io("listing", &dir, e))? {
            let e = e.map_err(|e| ShardError::io("listing", &dir, e))?;
            let path = e.path();
            if e.file_type()
                .map_err(|e| ShardError::io("listing", &path, e))?
                .is_dir()
            {
                todo.push(path);
            } else {
                let rel = path.strip_prefix(root).unwrap_or(&path);
                out.push((rel.to_string_lossy().replace('\\', "/"), path));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The uploads of one publication: all begun and filled before any is completed.
struct Uploads<'a> {
    store: &'a Store,
    cancel: &'a AtomicBool,
    /// Multipart uploads whose parts are all up, by name.
    open: Vec<(String, Box<dyn object_store::MultipartUpload>)>,
    /// Files of one part or less: put whole at completion.
    small: Vec<(String, PathBuf)>,
    /// Objects made visible so far (removed again if completion fails half-way).
    done: Vec<String>,
}

impl<'a> Uploads<'a> {
    fn new(store: &'a Store, cancel: &'a AtomicBool) -> Uploads<'a> {
        Uploads {
            store,
            cancel,
            open: Vec::new(),
            small: Vec::new(),
            done: Vec::new(),
        }
    }

    fn stopped(&self) -> ShardError {
        ShardError::Store(StoreError::Stopped {
            url: self.store.url.to_string(),
            op: "uploading",
            aborted: true,
        })
    }

    /// Uploads every part of every file in `files`.
    fn all(&mut self, files: &[(String, PathBuf)]) -> Result<(), ShardError> {
        for (name, path) in files {
            if self.cancel.load(Ordering::Relaxed) {
                return Err(self.stopped());
            }
            let len = fs::metadata(path)
                .map_err(|e| ShardError::io("reading", path, e))?
                .len();
            if len <= PART as u64 {
                self.small.push((name.clone(), path.clone()));
                continue;
            }
            let mut up = self.store.begin_upload(name)?;
            let mut file = fs::File::open(path).map_err(|e| ShardError::io("reading", path, e))?;
            let cancel = self.cancel;
            let url = self.store.url.to_string();
            let parts = std::iter::from_fn(|| {
                if cancel.load(Ordering::Relaxed) {
                    return Some(Err(StoreError::Stopped {
                        url: url.clone(),
                        op: "uploading",
                        aborted: true,
                    }));
                }
                let mut buf = Vec::with_capacity(PART);
                match (&mut file).take(PART as u64).read_to_end(&mut buf) {
                    Ok(0) => None,
                    Ok(_) => Some(Ok(bytes::Bytes::from(buf))),
                    Err(source) => Some(Err(StoreError::Local {
                        path: path.clone(),
                        op: "reading",
                        source,
                    })),
                }
            });
            let r = self.store.upload_parts(name, up.as_mut(), parts, IN_FLIGHT);
            self.open.push((name.clone(), up));
            r?;
        }
        Ok(())
    }

    /// Completes every upload and puts the small files: the output's objects appear.
    fn complete(&mut self) -> Result<(), ShardError> {
        if self.cancel.load(Ordering::Relaxed) {
            return Err(self.stopped());
        }
        while let Some((name, mut up)) = self.open.pop() {
            if let Err(e) = self.store.complete(&name, up.as_mut()) {
                self.open.push((name, up));
                return Err(e.into());
            }
            self.done.push(name);
        }
        for (name, path) in std::mem::take(&mut self.small) {
            let bytes = fs::read(&path).map_err(|e| ShardError::io("reading", &path, e))?;
            self.store.put(&name, bytes.into())?;
            self.done.push(name);
        }
        Ok(())
    }

    /// Aborts what is open and removes what completed: the failed run leaves no object.
    fn abort(&mut self) {
        for (_, up) in &mut self.open {
            self.store.abort(up.as_mut());
        }
        for name in &self.done {
            let _ = self.store.delete(name);
        }
    }
}
