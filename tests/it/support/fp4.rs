//! NVFP4 weights as tests read them back: FP4 codes unpacked from bytes, and a fused or split
//! tensor put back together from every rank (the llama_gqa fixture's qkv, gate/up and
//! row-parallel layers), for ModelOpt's and compressed-tensors' spellings alike.

use std::path::Path;

use tempfile::TempDir;

use super::{Held, Tensors, rank_tensors, read_files, shard_ok};

/// What one NVFP4 spelling calls a linear layer's tensors (the same in checkpoint and output).
pub(crate) struct Fp4Names {
    /// The packed weight: `weight` or `weight_packed`.
    pub weight: &'static str,
    /// The F32 scales with one slot per fused part, in order (global, then input when W4A4).
    pub per_part: &'static [&'static str],
}

/// A U8 matrix `[rows, bytes]` as its FP4 codes `[rows, 2·bytes]`, low nibble first.
pub(crate) fn codes(t: &Held) -> Vec<Vec<u8>> {
    let cols = t.shape[1] as usize;
    t.data
        .chunks(cols)
        .map(|r| r.iter().flat_map(|b| [b & 0xF, b >> 4]).collect())
        .collect()
}

/// Rows of a byte matrix (F8_E4M3 scales are one byte each).
pub(crate) fn byte_rows(t: &Held) -> Vec<Vec<u8>> {
    t.data
        .chunks(t.shape[1] as usize)
        .map(<[u8]>::to_vec)
        .collect()
}

/// The global rows `[at, at + n)` from every rank's `rows`, checking that ranks holding the same
/// rows (replicated kv heads) agree.
pub(crate) fn gather_rows(parts: &[(usize, Vec<Vec<u8>>)], total: usize) -> Vec<Vec<u8>> {
    let mut out: Vec<Option<Vec<u8>>> = vec![None; total];
    for (at, rows) in parts {
        for (i, r) in rows.iter().enumerate() {
            match &out[at + i] {
                Some(prev) => assert_eq!(prev, r, "replicas of row {} differ", at + i),
                None => out[at + i] = Some(r.clone()),
            }
        }
    }
    out.into_iter()
        .enumerate()
        .map(|(i, r)| r.unwrap_or_else(|| panic!("row {i} on no rank")))
        .collect()
}

/// Which rows of q, k and v rank `r` holds: (q offset, k/v offset, q rows, k/v rows).
pub(crate) fn qkv_rows(
    tp: usize,
    r: usize,
    [heads, kv, hd]: [usize; 3],
) -> (usize, usize, usize, usize) {
    let q = heads / tp * hd;
    let (kv_local, replicas) = if tp >= kv { (1, tp / kv) } else { (kv / tp, 1) };
    let k = kv_local * hd;
    (r * q, (r / replicas) * k, q, k)
}

/// Reassembles one fused column-parallel tensor per part from all ranks: `split` gives rank `r`'s
/// (offset in the part, rows) for each part, in the order the rank holds them.
pub(crate) fn column_parts(
    ranks: &[Tensors],
    name: &str,
    unpack: fn(&Held) -> Vec<Vec<u8>>,
    parts: &[usize],
    split: &dyn Fn(usize) -> Vec<(usize, usize)>,
) -> Vec<Vec<Vec<u8>>> {
    (0..parts.len())
        .map(|k| {
            let pieces: Vec<(usize, Vec<Vec<u8>>)> = ranks
                .iter()
                .enumerate()
                .map(|(r, t)| {
                    let rows = unpack(&t[name]);
                    let spans = split(r);
                    let start: usize = spans[..k].iter().map(|s| s.1).sum();
                    (spans[k].0, rows[start..start + spans[k].1].to_vec())
                })
                .collect();
            gather_rows(&pieces, parts[k])
        })
        .collect()
}

/// A row-parallel tensor from all ranks: each rank's columns side by side.
pub(crate) fn row_parallel(
    ranks: &[Tensors],
    name: &str,
    unpack: fn(&Held) -> Vec<Vec<u8>>,
) -> Vec<Vec<u8>> {
    let per_rank: Vec<Vec<Vec<u8>>> = ranks.iter().map(|t| unpack(&t[name])).collect();
    (0..per_rank[0].len())
        .map(|i| per_rank.iter().flat_map(|m| m[i].clone()).collect())
        .collect()
}

/// Shards the llama_gqa-shaped NVFP4 checkpoint `source` (8 heads, 4 kv heads, head_dim 16,
/// intermediate 256, 2 layers) at every TP in `tps` and checks that every rank's tensors,
/// unpacked to FP4 codes and put back together, are the checkpoint's; and the per-part scales.
pub(crate) fn assert_llama_gqa_fp4_reassembles(source: &Path, names: &Fp4Names, tps: &[usize]) {
    let ck = read_files(&[source.join("model.safetensors")]);
    let [heads, kv, hd] = [8, 4, 16];
    for &tp in tps {
        let out = TempDir::new().unwrap();
        shard_ok(source, tp as u64, out.path(), &[]);
        let ranks: Vec<Tensors> = (0..tp as u64)
            .map(|r| rank_tensors(out.path(), r))
            .collect();
        for layer in 0..2 {
            let l = format!("model.layers.{layer}");
            for (suffix, unpack) in [
                (names.weight, codes as fn(&Held) -> Vec<Vec<u8>>),
                ("weight_scale", byte_rows),
            ] {
                let qkv = column_parts(
                    &ranks,
                    &format!("{l}.self_attn.qkv_proj.{suffix}"),
                    unpack,
                    &[heads * hd, kv * hd, kv * hd],
                    &|r| {
                        let (qa, ka, q, k) = qkv_rows(tp, r, [heads, kv, hd]);
                        vec![(qa, q), (ka, k), (ka, k)]
                    },
                );
                for (part, proj) in qkv.iter().zip(["q_proj", "k_proj", "v_proj"]) {
                    let want = unpack(&ck[&format!("{l}.self_attn.{proj}.{suffix}")]);
                    assert_eq!(part, &want, "tp{tp} {l} {proj}.{suffix}");
                }
                let i = 256 / tp;
                let gate_up = column_parts(
                    &ranks,
                    &format!("{l}.mlp.gate_up_proj.{suffix}"),
                    unpack,
                    &[256, 256],
                    &|r| vec![(r * i, i), (r * i, i)],
                );
                for (part, proj) in gate_up.iter().zip(["gate_proj", "up_proj"]) {
                    let want = unpack(&ck[&format!("{l}.mlp.{proj}.{suffix}")]);
                    assert_eq!(part, &want, "tp{tp} {l} {proj}.{suffix}");
                }
                for row in ["self_attn.o_proj", "mlp.down_proj"] {
                    let got = row_parallel(&ranks, &format!("{l}.{row}.{suffix}"), unpack);
                    let want = unpack(&ck[&format!("{l}.{row}.{suffix}")]);
                    assert_eq!(got, want, "tp{tp} {l} {row}.{suffix}");
                }
            }
            // One F32 global scale per part, the checkpoint's, on every rank.
            for (fused, parts) in [
                (
                    "self_attn.qkv_proj",
                    &["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"][..],
                ),
                ("mlp.gate_up_proj", &["mlp.gate_proj", "mlp.up_proj"][..]),
                ("self_attn.o_proj", &["self_attn.o_proj"][..]),
            ] {
                for &scale in names.per_part {
                    let want: Vec<u8> = (parts.iter())
                        .flat_map(|p| ck[&format!("{l}.{p}.{scale}")].data.clone())
                        .collect();
                    for (r, t) in ranks.iter().enumerate() {
                        let got = &t[&format!("{l}.{fused}.{scale}")];
                        assert_eq!(
                            (got.dtype.as_str(), &got.shape, &got.data),
                            ("F32", &vec![parts.len() as u64], &want),
                            "tp{tp} rank {r} {l}.{fused}.{scale}"
                        );
                    }
                }
            }
        }
    }
}
