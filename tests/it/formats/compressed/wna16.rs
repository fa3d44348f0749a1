//! Pack-quantized dense layers: every rank's `weight_packed`, `weight_scale` and (asymmetric)
//! `weight_zero_point` unpacked and put back together — q/k/v out of `qkv_proj`, gate/up out of
//! `gate_up_proj`, the column slices of `o_proj` and `down_proj` — are the checkpoint's values,
//! at TP 1, 2, 4 and 8 (kv heads replicated at 8); `weight_shape` is the global shape of the
//! shard vLLM loads last.

use std::path::Path;

use serde_json::json;

use super::{Rng, pack, unpack, wna16_config};
use crate::support::*;

const FIXTURE: &str = "llama_gqa_w4a16";
const LAYERS: usize = 2;
const HEADS: usize = 8;
const KV_HEADS: usize = 4;
const HEAD_DIM: usize = 16;
const HIDDEN: usize = 128;
const INTER: usize = 256;

/// A row-major matrix of small values (packed ints unpacked, or BF16 bits).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Mat {
    pub rows: usize,
    pub cols: usize,
    pub vals: Vec<u32>,
}

impl Mat {
    pub(super) fn of_bf16(h: &Held) -> Mat {
        assert_eq!(h.dtype, "BF16");
        let vals = (h.data.chunks_exact(2))
            .map(|c| u32::from(u16::from_le_bytes([c[0], c[1]])))
            .collect();
        let cols = *h.shape.last().unwrap() as usize;
        Mat {
            rows: h.data.len() / 2 / cols,
            cols,
            vals,
        }
    }

    pub(super) fn of_packed(h: &Held, bits: u32, dim: usize) -> Mat {
        assert_eq!(h.dtype, "I32");
        let (vals, rows, cols) = unpack(&h.data, &h.shape, bits, dim);
        Mat { rows, cols, vals }
    }

    pub(super) fn rows(&self, from: usize, to: usize) -> Mat {
        Mat {
            rows: to - from,
            cols: self.cols,
            vals: self.vals[from * self.cols..to * self.cols].to_vec(),
        }
    }

    pub(super) fn cat_rows(parts: &[Mat]) -> Mat {
        Mat {
            rows: parts.iter().map(|m| m.rows).sum(),
            cols: parts[0].cols,
            vals: parts.iter().flat_map(|m| m.vals.clone()).collect(),
        }
    }

    pub(super) fn cat_cols(parts: &[Mat]) -> Mat {
        let rows = parts[0].rows;
        let mut vals = Vec::new();
        for r in 0..rows {
            for m in parts {
                vals.extend_from_slice(&m.vals[r * m.cols..(r + 1) * m.cols]);
            }
        }
        Mat {
            rows,
            cols: parts.iter().map(|m| m.cols).sum(),
            vals,
        }
    }
}

/// One scheme's checkpoint: per layer and projection, the values, scales and zero points.
pub(super) struct Scheme {
    pub bits: u32,
    pub group: Option<u64>,
    pub symmetric: bool,
}

/// The generated values of one projection.
struct Proj {
    weight: Mat,
    scale: Mat,
    zero: Option<Mat>,
}

const PROJS: [(&str, usize, usize); 7] = [
    ("self_attn.q_proj", HEADS * HEAD_DIM, HIDDEN),
    ("self_attn.k_proj", KV_HEADS * HEAD_DIM, HIDDEN),
    ("self_attn.v_proj", KV_HEADS * HEAD_DIM, HIDDEN),
    ("self_attn.o_proj", HIDDEN, HEADS * HEAD_DIM),
    ("mlp.gate_proj", INTER, HIDDEN),
    ("mlp.up_proj", INTER, HIDDEN),
    ("mlp.down_proj", HIDDEN, INTER),
];

/// The golden W4A16 fixture with `s`'s config and freshly generated quantized tensors (its
/// unquantized ones kept); `split` puts the tensors whose name it accepts in a second file.
/// Returns the folder and the values by `layer.proj`.
fn checkpoint(
    s: &Scheme,
    seed: u64,
    split: impl Fn(&str) -> bool,
) -> (tempfile::TempDir, std::collections::BTreeMap<String, Proj>) {
    let qc = wna16_config(u64::from(s.bits), s.group, s.symmetric, json!(["lm_head"]));
    let dir = fixture_with(FIXTURE, |c| {
        c.insert("quantization_config".into(), qc);
    });
    let kept = checkpoint_tensors(dir.path());
    let mut rng = Rng::new(seed);
    let mut owned: Vec<(String, &'static str, Vec<u64>, Vec<u8>)> = (kept.iter())
        .filter(|(n, _)| !PROJS.iter().any(|(p, ..)| n.contains(p)))
        .map(|(n, h)| {
            (
                n.clone(),
                dtype_name(&h.dtype),
                h.shape.clone(),
                h.data.clone(),
            )
        })
        .collect();
    let mut projs = std::collections::BTreeMap::new();
    for l in 0..LAYERS {
        for (p, n, k) in PROJS {
            let g = s.group.map_or(k, |g| g as usize);
            let name = format!("model.layers.{l}.{p}");
            let w = rng.values(n * k, s.bits);
            let scale = rng.bf16(n * (k / g));
            let pf = 32 / s.bits as usize;
            owned.push((
                format!("{name}.weight_packed"),
                "I32",
                vec![n as u64, (k / pf) as u64],
                pack(&w, n, k, s.bits, 1),
            ));
            owned.push((
                format!("{name}.weight_scale"),
                "BF16",
                vec![n as u64, (k / g) as u64],
                scale.clone(),
            ));
            let shape: Vec<u8> = [n as i64, k as i64]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect();
            owned.push((format!("{name}.weight_shape"), "I64", vec![2], shape));
            let zero = (!s.symmetric).then(|| rng.values(n * (k / g), s.bits));
            if let Some(z) = &zero {
                owned.push((
                    format!("{name}.weight_zero_point"),
                    "I32",
                    vec![(n / pf) as u64, (k / g) as u64],
                    pack(z, n, k / g, s.bits, 0),
                ));
            }
            let mat = |rows, cols, vals| Mat { rows, cols, vals };
            let scale_held = Held {
                dtype: "BF16".into(),
                shape: vec![n as u64, (k / g) as u64],
                data: scale,
            };
            projs.insert(
                format!("{l}.{p}"),
                Proj {
                    weight: mat(n, k, w),
                    scale: Mat::of_bf16(&scale_held),
                    zero: zero.map(|z| mat(n, k / g, z)),
                },
            );
        }
    }
    std::fs::remove_file(dir.path().join("model.safetensors")).unwrap();
    for (file, second) in [
        ("model-00001-of-00002.safetensors", false),
        ("model-00002-of-00002.safetensors", true),
    ] {
        let part: Vec<Tensor> = (owned.iter())
            .filter(|(n, ..)| split(n) == second)
            .map(|(n, d, s, b)| (n.as_str(), *d, s.as_slice(), b.as_slice()))
            .collect();
        write_safetensors(&dir.path().join(file), &part);
    }
    (dir, projs)
}

fn dtype_name(d: &str) -> &'static str {
    match d {
        "BF16" => "BF16",
        "I32" => "I32",
        "I64" => "I64",
        other => panic!("unexpected fixture dtype {other}"),
    }
}

/// Each rank's part of a fused column-parallel tensor, split into its logical parts (`sizes`
/// rows per rank), and the parts reassembled over the ranks that hold distinct rows.
fn unfuse(ranks: &[Mat], sizes: &[usize], distinct: &[Vec<usize>]) -> Vec<Mat> {
    (0..sizes.len())
        .map(|part| {
            let off: usize = sizes[..part].iter().sum();
            let pieces: Vec<Mat> = (ranks.iter())
                .map(|m| m.rows(off, off + sizes[part]))
                .collect();
            let chosen: Vec<Mat> = distinct[part].iter().map(|&r| pieces[r].clone()).collect();
            // Replicated kv heads: every copy of a head is the one its first holder has.
            for (r, p) in pieces.iter().enumerate() {
                let holder = distinct[part]
                    .iter()
                    .rev()
                    .find(|&&d| d <= r)
                    .copied()
                    .unwrap();
                assert_eq!(
                    p, &pieces[holder],
                    "rank {r} part {part}: a replica differs"
                );
            }
            Mat::cat_rows(&chosen)
        })
        .collect()
}

/// Which of a projection's generated values a rank tensor holds.
type Field = fn(&Proj) -> Option<&Mat>;

/// Shards at `tp` and compares every rank's quantized tensors, reassembled, with `projs`.
fn check_tp(dir: &Path, s: &Scheme, projs: &std::collections::BTreeMap<String, Proj>, tp: usize) {
    let out = tempfile::tempdir().unwrap();
    shard_ok(dir, tp as u64, out.path(), &[]);
    let ranks: Vec<Tensors> = (0..tp as u64)
        .map(|r| rank_tensors(out.path(), r))
        .collect();
    let (q_r, kv_r) = (HEADS / tp * HEAD_DIM, (KV_HEADS / tp).max(1) * HEAD_DIM);
    let all: Vec<usize> = (0..tp).collect();
    let kv_holders: Vec<usize> = (0..tp).step_by((tp / KV_HEADS).max(1)).collect();
    for l in 0..LAYERS {
        let get = |m: &str, t: &str| -> Vec<&Held> {
            (ranks.iter())
                .map(|r| {
                    r.get(&format!("model.layers.{l}.{m}.{t}"))
                        .unwrap_or_else(|| panic!("tp{tp}: no {m}.{t}"))
                })
                .collect()
        };
        let kinds: [(&str, Field); 3] = [
            ("weight_packed", |p| Some(&p.weight)),
            ("weight_scale", |p| Some(&p.scale)),
            ("weight_zero_point", |p| p.zero.as_ref()),
        ];
        for (t, field) in kinds {
            let read = |h: &Held| match t {
                "weight_packed" => Mat::of_packed(h, s.bits, 1),
                "weight_scale" => Mat::of_bf16(h),
                _ => Mat::of_packed(h, s.bits, 0),
            };
            let want = |p: &str| field(&projs[&format!("{l}.{p}")]).cloned();
            if want("self_attn.q_proj").is_none() {
                assert!(
                    !ranks[0].contains_key(&format!("model.layers.{l}.self_attn.qkv_proj.{t}"))
                );
                continue;
            }
            let qkv: Vec<Mat> = get("self_attn.qkv_proj", t).into_iter().map(read).collect();
            let parts = unfuse(
                &qkv,
                &[q_r, kv_r, kv_r],
                &[all.clone(), kv_holders.clone(), kv_holders.clone()],
            );
            for (part, p) in parts.iter().zip(["q_proj", "k_proj", "v_proj"]) {
                assert_eq!(
                    Some(part),
                    want(&format!("self_attn.{p}")).as_ref(),
                    "tp{tp} layer {l} {p}.{t}"
                );
            }
            let gu: Vec<Mat> = get("mlp.gate_up_proj", t).into_iter().map(read).collect();
            let i_r = INTER / tp;
            let parts = unfuse(&gu, &[i_r, i_r], &[all.clone(), all.clone()]);
            assert_eq!(
                Some(&parts[0]),
                want("mlp.gate_proj").as_ref(),
                "tp{tp} layer {l} gate.{t}"
            );
            assert_eq!(
                Some(&parts[1]),
                want("mlp.up_proj").as_ref(),
                "tp{tp} layer {l} up.{t}"
            );
            for p in ["self_attn.o_proj", "mlp.down_proj"] {
                let per: Vec<Mat> = get(p, t).into_iter().map(read).collect();
                // Channel scales and zero points are whole on every rank of a row-parallel layer.
                let got = if t != "weight_packed" && s.group.is_none() {
                    assert!(
                        per.iter().all(|m| m == &per[0]),
                        "tp{tp} {p}.{t} differs by rank"
                    );
                    per[0].clone()
                } else {
                    Mat::cat_cols(&per)
                };
                assert_eq!(Some(&got), want(p).as_ref(), "tp{tp} layer {l} {p}.{t}");
            }
        }
    }
}

/// The `weight_shape` every rank holds for `module` of layer `l`.
fn weight_shape(out: &Path, tp: u64, l: usize, module: &str) -> Vec<i64> {
    let all: Vec<Vec<i64>> = (0..tp)
        .map(|r| {
            let t = rank_tensors(out, r);
            let h = &t[&format!("model.layers.{l}.{module}.weight_shape")];
            assert_eq!((h.dtype.as_str(), h.shape.as_slice()), ("I64", &[2u64][..]));
            (h.data.chunks_exact(8))
                .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
                .collect()
        })
        .collect();
    assert!(
        all.iter().all(|s| s == &all[0]),
        "{module}: weight_shape differs by rank"
    );
    all[0].clone()
}

fn schemes() -> Vec<(Scheme, &'static [usize])> {
    vec![
        (
            Scheme {
                bits: 4,
                group: Some(16),
                symmetric: true,
            },
            &[1, 2, 4, 8],
        ),
        (
            Scheme {
                bits: 4,
                group: Some(16),
                symmetric: false,
            },
            &[1, 2, 4, 8],
        ),
        (
            Scheme {
                bits: 8,
                group: None,
                symmetric: true,
            },
            &[1, 2, 4, 8],
        ),
        (
            Scheme {
                bits: 8,
                group: None,
                symmetric: false,
            },
            &[2, 8],
        ),
        (
            Scheme {
                bits: 8,
                group: Some(32),
                symmetric: false,
            },
            &[1, 2, 4],
        ),
    ]
}

#[test]
fn every_ranks_packed_tensors_reassemble_into_the_checkpoints_values() {
    for (i, (s, tps)) in schemes().into_iter().enumerate() {
        let (dir, projs) = checkpoint(&s, i as u64 + 1, |_| false);
        for &tp in tps {
            check_tp(dir.path(), &s, &projs, tp);
        }
    }
}

/// `weight_shape` of a fused layer is the shard loaded last, whichever that is: in one sorted
/// file v_proj (after q/k) and up_proj (after gate); with q_proj's shape in a later file, q's.
#[test]
fn a_fused_weight_shape_is_the_last_loaded_shards() {
    let s = Scheme {
        bits: 4,
        group: Some(32),
        symmetric: true,
    };
    let late = |n: &str| n == "model.layers.0.self_attn.q_proj.weight_shape";
    let (dir, _) = checkpoint(&s, 7, late);
    let out = tempfile::tempdir().unwrap();
    shard_ok(dir.path(), 2, out.path(), &[]);
    let (q, kv) = ((HEADS * HEAD_DIM) as i64, (KV_HEADS * HEAD_DIM) as i64);
    let h = HIDDEN as i64;
    assert_eq!(
        weight_shape(out.path(), 2, 0, "self_attn.qkv_proj"),
        vec![q, h]
    );
    assert_eq!(
        weight_shape(out.path(), 2, 1, "self_attn.qkv_proj"),
        vec![kv, h]
    );
    assert_eq!(
        weight_shape(out.path(), 2, 1, "mlp.gate_up_proj"),
        vec![INTER as i64, h]
    );
    assert_eq!(
        weight_shape(out.path(), 2, 1, "self_attn.o_proj"),
        vec![h, q]
    );
    assert_eq!(
        weight_shape(out.path(), 2, 1, "mlp.down_proj"),
        vec![h, INTER as i64]
    );
}
