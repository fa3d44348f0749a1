//! Safetensors headers → the tensor table, read and validated by the `safetensors` crate over a
//! `pread` of each header, or over a header fetched on its own from a remote source such as the
//! hub ([`RemoteHeader`]: the checkpoint then has headers only, and its data cannot be read:
//! [`Checkpoint::data_readable`]).
//! Tensor data is never read at this stage.

mod error;
mod header;

pub use error::HeaderError;
pub use header::read_header;
pub(crate) use header::{check_prefix, read_remote_header};

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::fs::File;
use std::hash::BuildHasher;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use hashbrown::HashTable;
use hashbrown::hash_table::Entry;
use rayon::prelude::*;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};

use crate::dtype::Dtype;
use crate::file_stamp::FileStamp;

/// The hasher for maps keyed by tensor names: 128k names in a large checkpoint, and SipHash's
/// resistance to chosen keys buys nothing for names read from local files.
type NameHasher = foldhash::fast::RandomState;

/// safetensors refuses headers above 100 MB; so do we, before allocating.
pub const MAX_HEADER_LEN: u64 = 100_000_000;

/// The most tensors wload reads from one file. Real files hold up to tens of thousands
/// (DeepSeek-V3: about 91,000 over 163 files); a 100 MB header can list over a million tiny ones,
/// which cost a gigabyte and most of a minute in the stages after it.
pub(crate) const MAX_TENSORS_PER_FILE: usize = 1 << 18;

/// The most tensors wload reads from one checkpoint, all files together: twice the ~250,000 of
/// the largest INT4 MoE releases. Each costs a few hundred bytes in every stage (name table,
/// mapping, plan), so this bounds a checkpoint's planning to about half a gigabyte.
pub(crate) const MAX_TENSORS: usize = 1 << 19;

/// One tensor as a header describes it.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct TensorInfo {
    /// Shared, not copied, by the plan's sources (a DeepSeek-V3 plan reads 90,000 tensors).
    pub name: std::sync::Arc<str>,
    pub dtype: Dtype,
    /// Inline up to four dimensions: the planner compares every tensor's shape, and a separate
    /// allocation per tensor (90,000 in a DeepSeek-V3 checkpoint) was a cache miss per compare.
    pub shape: smallvec::SmallVec<[u64; 4]>,
    /// Index into [`Checkpoint::files`].
    pub file: usize,
    /// Absolute byte offset of the data in the file.
    pub offset: u64,
    /// Data bytes.
    pub len: u64,
}

impl TensorInfo {
    pub(crate) fn numel(&self) -> u64 {
        self.shape.iter().product()
    }
}

/// One safetensors file, header parsed and validated.
#[derive(Debug, Clone)]
pub struct WeightFile {
    /// File name relative to the checkpoint folder.
    pub name: String,
    pub path: PathBuf,
    pub size: u64,
    pub header_len: u64,
    /// The file as it was when its header was read: the engine reads its data only while it
    /// still is that file, unchanged.
    pub stamp: FileStamp,
    /// Where the file's data is: on disk, or nowhere (only its header was fetched).
    pub backing: Backing,
    pub metadata: Option<BTreeMap<String, String>>,
    /// Tensors in key order (what `safe_open().keys()` gives vLLM).
    pub tensors: Vec<TensorInfo>,
}

impl WeightFile {
    pub fn data_start(&self) -> u64 {
        8 + self.header_len
    }
}

/// Where a weight file's tensor data is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backing {
    /// In the file at [`WeightFile::path`], which the header was read from.
    File,
    /// Nowhere on this machine: only the header was fetched (from the hub, by `Range` requests, or
    /// from the cache's copy of such a header). `path` is where the file would be.
    HeaderOnly {
        /// The blob's etag: its content identity on the hub.
        etag: String,
    },
    /// In object storage (`s3://…`): read by ranged GETs of exactly the planned bytes
    /// (`resolve::store::data`), each checked against this etag.
    Object { etag: String },
}

/// A file's first `8 + N` bytes (its header) obtained without the file: what
/// [`read_remote_header`] parses, with the same checks as a local file's.
#[derive(Debug, Clone)]
pub struct RemoteHeader {
    /// File name relative to the checkpoint folder.
    pub name: String,
    /// Where the file would be (for messages).
    pub path: PathBuf,
    /// The whole file's size, as the server stated it.
    pub size: u64,
    /// The file's first bytes: the 8-byte length and the header, or as many as were fetched
    /// when the length is refused.
    pub bytes: Vec<u8>,
    pub etag: String,
    /// The data can be read where the header came from (object storage, by ranged reads): the
    /// file is [`Backing::Object`], not [`Backing::HeaderOnly`].
    pub readable: bool,
}

/// A name that appears in more than one file. vLLM loads files in order and the last write wins.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct Duplicate {
    pub name: String,
    /// File names in load order; the last one is the one vLLM keeps.
    pub files: Vec<String>,
}

/// All weight files of a checkpoint, in vLLM's load order.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    pub files: Vec<WeightFile>,
    pub duplicates: Vec<Duplicate>,
    /// name → (file index, position in that file's tensors) of the copy vLLM keeps. The table
    /// holds only the positions and finds names through them: no copy of 100k+ names. Both fit
    /// in `u32`: a header of at most 100 MB cannot list 2^32 tensors.
    winners: HashTable<(u32, u32)>,
    hasher: NameHasher,
    /// Whether some name appears in more than one file (so some copies are shadowed).
    shadowing: bool,
}

impl Checkpoint {
    /// Reads and validates the headers of `names` (already in load order), in parallel. Every bad
    /// file is reported, in load order.
    pub fn open(root: &Path, names: &[String]) -> Result<Checkpoint, Vec<HeaderError>> {
        Checkpoint::open_with(root, names, &BTreeMap::new())
    }

    /// [`Checkpoint::open`], where the files named in `remote` have only their header (fetched
    /// from a remote source: `Resolved::headers`): those are parsed from it, the others read
    /// from `root`.
    pub(crate) fn open_with(
        root: &Path,
        names: &[String],
        remote: &BTreeMap<String, RemoteHeader>,
    ) -> Result<Checkpoint, Vec<HeaderError>> {
        let results: Vec<Result<WeightFile, HeaderError>> = names
            .par_iter()
            .enumerate()
            .map(|(i, name)| match remote.get(name) {
                Some(h) => read_remote_header(h, i),
                None => read_header(&root.join(name), name, i),
            })
            .collect();
        let mut files = Vec::with_capacity(results.len());
        let mut errors = Vec::new();
        for r in results {
            match r {
                Ok(f) => files.push(f),
                Err(e) => errors.push(e),
            }
        }
        if errors.is_empty() {
            Checkpoint::within_limit(root, &files).map_err(|e| vec![e])?;
            Ok(Checkpoint::from_files(files))
        } else {
            Err(errors)
        }
    }

    /// The files' tensors together are within [`MAX_TENSORS`].
    pub(crate) fn within_limit(root: &Path, files: &[WeightFile]) -> Result<(), HeaderError> {
        let count = files.iter().map(|f| f.tensors.len()).sum();
        if count > MAX_TENSORS {
            return Err(HeaderError::TooManyTensorsInCheckpoint {
                root: root.to_path_buf(),
                count,
                limit: MAX_TENSORS,
            });
        }
        Ok(())
    }

    pub fn from_files(files: Vec<WeightFile>) -> Checkpoint {
        let hasher = NameHasher::default();
        let total = files.iter().map(|f| f.tensors.len()).sum();
        let mut winners: HashTable<(u32, u32)> = HashTable::with_capacity(total);
        let mut seen_in: HashMap<&str, Vec<usize>, NameHasher> = HashMap::default();
        let name_at =
            |&(fi, ti): &(u32, u32)| files[fi as usize].tensors[ti as usize].name.as_ref();
        for (fi, f) in files.iter().enumerate() {
            for (ti, t) in f.tensors.iter().enumerate() {
                let name = &*t.name;
                let at = (fi as u32, ti as u32);
                match winners.entry(
                    hasher.hash_one(name),
                    |p| name_at(p) == name,
                    |p| hasher.hash_one(name_at(p)),
                ) {
                    Entry::Occupied(mut o) => {
                        *o.get_mut() = at;
                        seen_in.entry(name).or_default();
                    }
                    Entry::Vacant(v) => {
                        v.insert(at);
                    }
                }
            }
        }
        let mut duplicates = Vec::new();
        let shadowing = !seen_in.is_empty();
        if shadowing {
            for f in &files {
                for t in &f.tensors {
                    if let Some(v) = seen_in.get_mut(&*t.name) {
                        v.push(t.file);
                    }
                }
            }
            duplicates = seen_in
                .into_iter()
                .map(|(name, fis)| Duplicate {
                    name: name.to_string(),
                    files: fis.iter().map(|&i| files[i].name.clone()).collect(),
                })
                .collect();
            duplicates.sort_by(|a, b| a.name.cmp(&b.name));
        }
        Checkpoint {
            files,
            duplicates,
            winners,
            hasher,
            shadowing,
        }
    }

    /// Whether tensor data can be read: every file is on disk. A checkpoint of hub headers only
    /// (`inspect`, `plan`, `sizes`, `load --dry-run`) says which file is not.
    pub fn data_readable(&self) -> Result<(), HeaderError> {
        let unreadable = |f: &&WeightFile| matches!(f.backing, Backing::HeaderOnly { .. });
        match self.files.iter().find(unreadable) {
            None => Ok(()),
            Some(f) => Err(HeaderError::HeaderOnly {
                path: f.path.clone(),
            }),
        }
    }

    /// Where the copy of `name` that vLLM keeps is: (file index, position in its tensors).
    fn winner(&self, name: &str) -> Option<(usize, usize)> {
        self.winners
            .find(self.hasher.hash_one(name), |&(fi, ti)| {
                self.files[fi as usize].tensors[ti as usize].name.as_ref() == name
            })
            .map(|&(fi, ti)| (fi as usize, ti as usize))
    }

    /// Every tensor of every file, in load order, including copies that a later file shadows.
    pub(crate) fn all_tensors(&self) -> impl Iterator<Item = &TensorInfo> {
        self.files.iter().flat_map(|f| f.tensors.iter())
    }

    /// The tensor vLLM ends up with under `name`.
    pub(crate) fn get(&self, name: &str) -> Option<&TensorInfo> {
        self.winner(name)
            .map(|(fi, ti)| &self.files[fi].tensors[ti])
    }

    /// True when this copy is the one that survives (not shadowed by a later file).
    pub(crate) fn is_effective(&self, t: &TensorInfo) -> bool {
        // Without duplicate names every copy survives, and a name lookup per tensor (100k of
        // them in a large MoE) is spared.
        if !self.shadowing {
            return true;
        }
        self.winner(&t.name).is_some_and(|(fi, _)| fi == t.file)
    }
}
