//! Every tensor of some safetensors files (an output rank, a PP stage, a checkpoint folder), read
//! through the crate-independent header reader, for byte comparisons.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use super::{files_with_prefix, header_tensors};

/// A tensor: dtype, shape, data bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub dtype: String,
    pub shape: Vec<u64>,
    pub data: Vec<u8>,
}

impl Held {
    /// Bytes of rows `[from, to)` along the first dimension.
    pub fn rows(&self, from: usize, to: usize) -> &[u8] {
        let row = self.data.len() / self.shape[0] as usize;
        &self.data[from * row..to * row]
    }

    /// Of a 2-D tensor, columns `[from, to)` of every row, concatenated.
    pub fn cols(&self, from: usize, to: usize) -> Vec<u8> {
        let el = self.data.len() / self.shape.iter().product::<u64>() as usize;
        self.data
            .chunks(self.shape[1] as usize * el)
            .flat_map(|r| r[from * el..to * el].to_vec())
            .collect()
    }
}

/// Tensors by name.
pub type Tensors = BTreeMap<String, Held>;

/// Every tensor of `files`; a name in two files (or twice in one) fails the test.
pub fn read_files(files: &[PathBuf]) -> Tensors {
    let mut out = Tensors::new();
    for f in files {
        let bytes = fs::read(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let base = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        for t in header_tensors(f) {
            let held = Held {
                dtype: t.dtype,
                shape: t.shape,
                data: bytes[base + t.start as usize..base + t.end as usize].to_vec(),
            };
            let dup = out.insert(t.name.clone(), held);
            assert!(dup.is_none(), "{}: '{}' twice", f.display(), t.name);
        }
    }
    out
}

/// Rank `r` of a TP-only output folder (wload's or vLLM's); a rank without files fails the test.
pub fn rank_tensors(dir: &Path, r: u64) -> Tensors {
    output_tensors(dir, &format!("model-rank-{r}-part-"))
}

/// Stage `p`, TP rank `t` of a PP output folder; a stage without files fails the test.
pub fn stage_tensors(dir: &Path, p: u64, t: u64) -> Tensors {
    output_tensors(dir, &format!("model-pp-{p}-tp-{t}-part-"))
}

/// The files `{prefix}{part}.safetensors` of an output folder, at least one.
fn output_tensors(dir: &Path, prefix: &str) -> Tensors {
    let files = files_with_prefix(dir, prefix);
    assert!(!files.is_empty(), "{}: no {prefix}* files", dir.display());
    read_files(&files)
}

/// Every tensor of a checkpoint folder (all its `*.safetensors`, in name order).
pub fn checkpoint_tensors(dir: &Path) -> Tensors {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    assert!(
        !files.is_empty(),
        "{}: no *.safetensors files",
        dir.display()
    );
    read_files(&files)
}
