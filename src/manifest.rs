//! `wload.json`: what `wload shard` wrote (source, TP, flags, every part file with its size and
//! XXH3), read back by `load` (to check a pre-sharded folder) and by `shard --force` (to tell an
//! earlier output from a folder of the user's).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// The manifest's file name, next to the part files.
pub const MANIFEST: &str = "wload.json";

/// What `wload shard` wrote into OUT, as `wload.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    pub wload_version: String,
    /// vLLM's format and version these files are for.
    pub format: String,
    pub source: String,
    pub architecture: String,
    pub family: String,
    pub tp: u64,
    /// Pipeline stages; absent (written only when above 1) means 1.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub pp: u64,
    pub ranks: Vec<u64>,
    pub expert_parallel: bool,
    pub dtype: String,
    pub max_part_size: u64,
    pub tie_word_embeddings: bool,
    pub files: Vec<ManifestFile>,
    /// Everything else wload put in OUT (config.json, copied side files), so that `--force`
    /// can tell an earlier output from a folder with the user's own files in it. Absent in
    /// manifests of wload 0.1.0 before it was added.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub side_files: Option<Vec<String>>,
}

fn one() -> u64 {
    1
}

fn is_one(n: &u64) -> bool {
    *n == 1
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ManifestFile {
    pub name: String,
    /// The global rank (`pp_rank * tp + tp_rank`).
    pub rank: u64,
    /// With pipeline parallelism, the file's stage and TP rank (absent without: `rank` is the TP
    /// rank, and TP-only manifests stay as they were).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pp_rank: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tp_rank: Option<u64>,
    pub part: u64,
    pub size: u64,
    /// XXH3-64 of the whole file, hex.
    pub xxh3: String,
}

impl Manifest {
    /// The manifest of folder `dir`, if it has a readable one.
    pub fn read(dir: &Path) -> Option<Manifest> {
        serde_json::from_slice(&crate::small_file::read(&dir.join(MANIFEST)).ok()?).ok()
    }
}

/// XXH3-64 of a file, hex; the manifest's fast hash.
pub fn hash_file(path: &Path) -> io::Result<String> {
    hash_open(&File::open(path)?, &|| false)
}

/// Bytes read per step when hashing: small enough that the step stays in the core's L2 cache
/// between the kernel's copy and the hash (an 8 MiB step made hashing a third slower), and read
/// rather than mapped, so the file's pages never count as this process's memory.
const HASH_STEP: usize = 256 << 10;

/// XXH3-64 of an open file from its start, hex. `stop` is asked between steps; when it says yes
/// the hash ends with [`io::ErrorKind::Interrupted`].
pub fn hash_open(f: &File, stop: &dyn Fn() -> bool) -> io::Result<String> {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    let mut buf = vec![0u8; HASH_STEP];
    let mut at = 0u64;
    loop {
        if stop() {
            return Err(io::ErrorKind::Interrupted.into());
        }
        let n = f.read_at(&mut buf, at)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        at += n as u64;
    }
    Ok(format!("{:016x}", h.digest()))
}
