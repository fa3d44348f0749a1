//! Every tensor of some safetensors files (an output rank, a PP stage, a checkpoint folder), read
//! through the crate-independent header reader, for byte comparisons.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use super::{files_with_prefix, header_tensors};

/// A tensor: dtype, shape, data bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Held {
    pub dtype: String,
    pub shape: Vec<u64>,
    pub data: Vec<u8>,
}

impl Held {
    /// Bytes of rows `[from, to)` along the first dimension.
    pub(crate) fn rows(&self, from: usize, to: usize) -> &[u8] {
        let row = self.data.len() / self.shape[0] as usize;
        &self.data[from * row..to * row]
    }

    /// Of a 2-D tensor, columns `[from, to)` of every row, concatenated.
    pub(crate) fn cols(&self, from: usize, to: usize) -> Vec<u8> {
        let el = self.data.len() / self.shape.iter().product::<u64>() as usize;
        self.data
            .chunks(self.shape[1] as usize * el)
            .flat_map(|r| r[from * el..to * el].to_vec())
            .collect()
    }
}

/// Tensors by name.
pub(crate) type Tensors = BTreeMap<String, Held>;

/// Every tensor of `files`; a name in two files (or twice in one) fails the test.
pub(crate) fn read_files(files: &[PathBuf]) -> Tensors {
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
pub(crate) fn rank_tensors(dir: &Path, r: u64) -> Tensors {
    output_tensors(dir, &format!("model-rank-{r}-part-"))
}

/// Stage `p`, TP rank `t` of a PP output folder; a stage without files fails the test.
pub(crate) fn stage_tensors(dir: &Path, p: u64, t: u64) -> Tensors {
    output_tensors(dir, &format!("model-pp-{p}-tp-{t}-part-"))
}

/// The files `{prefix}{part}.safetensors` of an output folder, at least one.
fn output_tensors(dir: &Path, prefix: &str) -> Tensors {
    let files = files_with_prefix(dir, prefix);
    assert!(!files.is_empty(), "{}: no {prefix}* files", dir.display());
    read_files(&files)
}

/// Every tensor of a checkpoint folder (all its `*.safetensors`, in name order).
pub(crate) fn checkpoint_tensors(dir: &Path) -> Tensors {
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

/// splitmix64: a well-mixed value for each (tensor, element), so that no two slices of a
/// generated checkpoint are equal by accident.
pub(crate) fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// `n` BF16 values for tensor number `t`: finite (exponent kept near 1.0, never NaN or Inf, so a
/// widening to F32 is exact and comparable bit for bit), sign and low bits from the hash.
pub(crate) fn bf16_data(t: u64, n: usize) -> Vec<u8> {
    (0..n as u64)
        .flat_map(|k| {
            let h = mix(t << 32 | k) as u16;
            ((h & 0x80FF) | 0x3F00).to_le_bytes()
        })
        .collect()
}

/// Asserts that `got[name]` has `dtype`, `shape` and exactly `want` as bytes.
pub(crate) fn assert_tensor(
    got: &Tensors,
    name: &str,
    dtype: &str,
    shape: &[usize],
    want: &[u8],
    ctx: &str,
) {
    let t = got
        .get(name)
        .unwrap_or_else(|| panic!("{ctx}: no '{name}'"));
    assert_eq!(t.dtype, dtype, "{ctx}: {name} dtype");
    let shape: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
    assert_eq!(t.shape, shape, "{ctx}: {name} shape");
    assert!(
        t.data == want,
        "{ctx}: {name}: bytes differ from the expected slice"
    );
}

/// Writes `tensors`, in the order given, as the one safetensors file `path`.
pub(crate) fn write_held<'a>(
    path: &Path,
    tensors: impl IntoIterator<Item = (&'a String, &'a Held)>,
) {
    let list: Vec<super::Tensor> = tensors
        .into_iter()
        .map(|(n, t)| (n.as_str(), t.dtype.as_str(), &t.shape[..], &t.data[..]))
        .collect();
    super::write_safetensors(path, &list);
}

/// A new temp folder holding `config` as config.json and `tensors` as one model.safetensors.
pub(crate) fn write_checkpoint(config: &serde_json::Value, tensors: &Tensors) -> tempfile::TempDir {
    let tmp = tempfile::TempDir::new().unwrap();
    super::write_json(&tmp.path().join("config.json"), config);
    write_held(&tmp.path().join("model.safetensors"), tensors);
    tmp
}

impl Held {
    /// A tensor of `dtype` and `shape` holding `data`.
    pub(crate) fn new(dtype: &str, shape: &[usize], data: Vec<u8>) -> Held {
        let shape: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
        let n = shape.iter().product::<u64>().max(1) as usize;
        assert_eq!(data.len() % n, 0, "{dtype} {shape:?}: {} bytes", data.len());
        Held {
            dtype: dtype.into(),
            shape,
            data,
        }
    }

    /// Of a 2-D tensor (or one 2-D item of a 3-D one: [`Held::item`]), the transpose.
    pub(crate) fn transposed(&self) -> Held {
        let (rows, cols) = (self.shape[0] as usize, self.shape[1] as usize);
        let el = self.data.len() / (rows * cols);
        let data = (0..cols)
            .flat_map(|c| (0..rows).map(move |r| (r * cols + c) * el))
            .flat_map(|at| self.data[at..at + el].to_vec())
            .collect();
        Held::new(&self.dtype, &[cols, rows], data)
    }

    /// Item `i` along the first dimension, as a tensor of the remaining dimensions.
    pub(crate) fn item(&self, i: usize) -> Held {
        let shape: Vec<usize> = self.shape[1..].iter().map(|&d| d as usize).collect();
        Held::new(&self.dtype, &shape, self.rows(i, i + 1).to_vec())
    }

    /// A BF16 tensor as F32: each value's bits shifted into the F32's high half (exact, as
    /// torch's cast); an F32 tensor as it is.
    pub(crate) fn to_f32(&self) -> Held {
        let shape: Vec<usize> = self.shape.iter().map(|&d| d as usize).collect();
        let data = match self.dtype.as_str() {
            "F32" => self.data.clone(),
            "BF16" => self
                .data
                .chunks(2)
                .flat_map(|b| (u32::from(u16::from_le_bytes([b[0], b[1]])) << 16).to_le_bytes())
                .collect(),
            d => panic!("to_f32 of {d}"),
        };
        Held::new("F32", &shape, data)
    }
}

/// Asserts that `got` holds exactly the tensors of `want`: the same names, and for each the same
/// dtype, shape and bytes.
pub(crate) fn assert_same_tensors(got: &Tensors, want: &Tensors, ctx: &str) {
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>(),
        "{ctx}: key set"
    );
    for (name, w) in want {
        let g = &got[name];
        assert_eq!((&g.dtype, &g.shape), (&w.dtype, &w.shape), "{ctx}: {name}");
        assert!(
            g.data == w.data,
            "{ctx}: {name}: other bytes than the rule's"
        );
    }
}

/// Rank `r` of `tp`'s rows of a vocab-parallel tensor (embedding, lm_head) with vLLM's padding:
/// the vocab rounded up to a multiple of 64, split evenly, rows past the vocab zero
/// (`vocab_parallel_embedding.py`: `pad_vocab_size`, the loader's `fill_(0)`).
pub(crate) fn vocab_rows(t: &Held, r: usize, tp: usize) -> Held {
    let vocab = t.shape[0] as usize;
    let per = vocab.div_ceil(64) * 64 / tp;
    let (from, to) = (r * per, (r + 1) * per);
    let (a, b) = (from.min(vocab), to.min(vocab));
    let row = t.data.len() / vocab;
    let mut data = t.rows(a, b).to_vec();
    data.resize(per * row, 0);
    let mut shape: Vec<usize> = t.shape.iter().map(|&d| d as usize).collect();
    shape[0] = per;
    Held::new(&t.dtype, &shape, data)
}

/// Rank `r` of `tp`'s rows of a tensor of `heads` KV heads of `hd` rows each (k, v, a k norm):
/// an even split when the heads divide among the ranks, else the one head `r / (tp / heads)`
/// that rank holds (vLLM replicates KV heads, `QKVParallelLinear`).
pub(crate) fn kv_rows(t: &Held, r: usize, tp: usize, heads: usize, hd: usize) -> &[u8] {
    if heads >= tp {
        let per = heads * hd / tp;
        t.rows(r * per, (r + 1) * per)
    } else {
        let h = r / (tp / heads);
        t.rows(h * hd, (h + 1) * hd)
    }
}

/// An expert-parallel output against the rules and the plain TP output of the same size: rank
/// `r` holds exactly `want(r)` (its whole experts), and every tensor but the routed experts as
/// the TP output's rank `r`. `check` sees each rank's tensors for what a family adds.
pub(crate) fn assert_expert_parallel(
    (ep, tp): (&Path, &Path),
    ranks: usize,
    want: impl Fn(usize) -> Tensors,
    check: impl Fn(&Tensors, &str),
) {
    for r in 0..ranks {
        let ctx = format!("ep{ranks} rank {r}");
        let got = rank_tensors(ep, r as u64);
        assert_same_tensors(&got, &want(r), &ctx);
        check(&got, &ctx);
        let plain = rank_tensors(tp, r as u64);
        for (name, t) in got.iter().filter(|(n, _)| !n.contains("routed_experts")) {
            assert_eq!(t, &plain[name], "{ctx}: {name} as at TP {ranks}");
        }
    }
}

/// A `--pp 2 --tp 2` output: stage `p` holds layer `p` (names under `layers`, `model.layers.`)
/// of `want(t)` for TP rank `t`, the embedding on stage 0 and the rest (final norm, lm_head) on
/// stage 1, each tensor as the rules say.
pub(crate) fn assert_two_stages(dir: &Path, layers: &str, want: impl Fn(usize) -> Tensors) {
    for p in 0..2usize {
        for t in 0..2usize {
            let on_stage = |n: &String| match n.strip_prefix(layers) {
                Some(rest) => rest.starts_with(&format!("{p}.")),
                None if n.contains("embed_tokens") => p == 0,
                None => p == 1,
            };
            let want: Tensors = want(t).into_iter().filter(|(n, _)| on_stage(n)).collect();
            let got = stage_tensors(dir, p as u64, t as u64);
            assert_same_tensors(&got, &want, &format!("pp stage {p} tp {t}"));
        }
    }
}
