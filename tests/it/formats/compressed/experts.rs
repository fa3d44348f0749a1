//! Pack-quantized routed experts on the DeepSeek-V3 architecture (Kimi-K2 style: int4 group 32,
//! attention, shared experts and the dense layer left BF16 by `ignore`): every non-expert tensor
//! is what the BF16 checkpoint gives, byte for byte, and every rank's packed experts, unpacked
//! and put back together, are the checkpoint's — at TP 1 and 2 and under EP 2.

use std::path::Path;

use serde_json::json;

use super::wna16::Mat;
use super::{Rng, pack, wna16_config};
use crate::support::*;

const FIXTURE: &str = "deepseek_v3";
const E: usize = 8;
const I: usize = 64;
const H: usize = 128;
const G: usize = 32;
const PREFIX: &str = "model.layers.1.mlp.experts";

/// The generated values of one expert projection.
struct Values {
    weight: Mat,
    scale: Mat,
    zero: Option<Mat>,
}

/// Expert `e` of a `[E_l, rows, cols]` tensor, as a 2-D tensor.
fn expert(h: &Held, e: usize) -> Held {
    let n = h.data.len() / h.shape[0] as usize;
    Held {
        dtype: h.dtype.clone(),
        shape: h.shape[1..].to_vec(),
        data: h.data[e * n..(e + 1) * n].to_vec(),
    }
}

/// The BF16 DeepSeek-V3 fixture with its routed experts int4-quantized (random values) and a
/// K2-style ignore list; the values by `(expert, proj)`.
fn checkpoint(symmetric: bool) -> (tempfile::TempDir, Vec<Vec<Values>>) {
    let ignore = json!([
        "lm_head",
        "re:.*self_attn.*",
        "re:.*shared_experts.*",
        "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"
    ]);
    let qc = wna16_config(4, Some(G as u64), symmetric, ignore);
    let dir = fixture_with(FIXTURE, |c| {
        c.insert("quantization_config".into(), qc);
    });
    let kept = checkpoint_tensors(dir.path());
    let mut owned: Vec<(String, String, Vec<u64>, Vec<u8>)> = (kept.into_iter())
        .filter(|(n, _)| !n.starts_with(&format!("{PREFIX}.")))
        .map(|(n, h)| (n, h.dtype, h.shape, h.data))
        .collect();
    let mut rng = Rng::new(11 + u64::from(symmetric));
    let mut values = Vec::new();
    for e in 0..E {
        let mut per = Vec::new();
        for (p, n, k) in [("gate_proj", I, H), ("up_proj", I, H), ("down_proj", H, I)] {
            let name = format!("{PREFIX}.{e}.{p}");
            let w = rng.values(n * k, 4);
            let scale = rng.bf16(n * (k / G));
            let shape = |v: &[usize]| v.iter().map(|&x| x as u64).collect::<Vec<u64>>();
            owned.push((
                format!("{name}.weight_packed"),
                "I32".into(),
                shape(&[n, k / 8]),
                pack(&w, n, k, 4, 1),
            ));
            let held = Held {
                dtype: "BF16".into(),
                shape: shape(&[n, k / G]),
                data: scale,
            };
            owned.push((
                format!("{name}.weight_scale"),
                "BF16".into(),
                held.shape.clone(),
                held.data.clone(),
            ));
            let dims: Vec<u8> = [n as i64, k as i64]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect();
            owned.push((format!("{name}.weight_shape"), "I64".into(), vec![2], dims));
            let zero = (!symmetric).then(|| rng.values(n * (k / G), 4));
            if let Some(z) = &zero {
                owned.push((
                    format!("{name}.weight_zero_point"),
                    "I32".into(),
                    shape(&[n / 8, k / G]),
                    pack(z, n, k / G, 4, 0),
                ));
            }
            per.push(Values {
                weight: Mat {
                    rows: n,
                    cols: k,
                    vals: w,
                },
                scale: Mat::of_bf16(&held),
                zero: zero.map(|z| Mat {
                    rows: n,
                    cols: k / G,
                    vals: z,
                }),
            });
        }
        values.push(per);
    }
    for f in std::fs::read_dir(dir.path()).unwrap() {
        let p = f.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        if name.starts_with("model")
            && (name.ends_with(".safetensors") || name.ends_with(".index.json"))
        {
            std::fs::remove_file(p).unwrap();
        }
    }
    let all: Vec<Tensor> = (owned.iter())
        .map(|(n, d, s, b)| (n.as_str(), d.as_str(), s.as_slice(), b.as_slice()))
        .collect();
    write_safetensors(&dir.path().join("model.safetensors"), &all);
    (dir, values)
}

/// Shards the fixture and the quantized checkpoint alike and compares every rank.
fn check(quantized: &Path, values: &[Vec<Values>], tp: u64, ep: bool) {
    let extra: &[&str] = if ep {
        &["--enable-expert-parallel"]
    } else {
        &[]
    };
    let (plain, out) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    shard_ok(&fixture(FIXTURE), tp, plain.path(), extra);
    shard_ok(quantized, tp, out.path(), extra);
    let what = format!("tp{tp} ep {ep}");
    let base = format!("{PREFIX}.routed_experts.");
    let mut parts: Vec<Vec<[Vec<Mat>; 3]>> = (0..E)
        .map(|_| {
            vec![
                [vec![], vec![], vec![]],
                [vec![], vec![], vec![]],
                [vec![], vec![], vec![]],
            ]
        })
        .collect();
    for r in 0..tp {
        let (want, got) = (rank_tensors(plain.path(), r), rank_tensors(out.path(), r));
        for (name, t) in &want {
            if !name.starts_with(&base) {
                assert_eq!(
                    got.get(name),
                    Some(t),
                    "{what} rank {r}: {name} differs from the bf16 checkpoint's"
                );
            }
        }
        assert!(
            !got.contains_key(&format!("{base}w13_weight")),
            "{what}: an unquantized w13_weight"
        );
        let e_l = if ep { E / tp as usize } else { E };
        let first = if ep { r as usize * e_l } else { 0 };
        let i_r = if ep { I } else { I / tp as usize };
        let t = |n: &str| {
            got.get(&format!("{base}{n}"))
                .unwrap_or_else(|| panic!("{what}: no {n}"))
        };
        for (n, dtype, shape) in [
            ("w13_weight_packed", "I32", vec![e_l, 2 * i_r, H / 8]),
            ("w2_weight_packed", "I32", vec![e_l, H, i_r / 8]),
            ("w13_weight_scale", "BF16", vec![e_l, 2 * i_r, H / G]),
            ("w2_weight_scale", "BF16", vec![e_l, H, i_r / G]),
            ("w13_weight_shape", "BF16", vec![e_l, 2]),
            ("w2_weight_shape", "BF16", vec![e_l, 2]),
        ] {
            let shape: Vec<u64> = shape.iter().map(|&x| x as u64).collect();
            assert_eq!(
                (t(n).dtype.as_str(), &t(n).shape),
                (dtype, &shape),
                "{what} rank {r}: {n}"
            );
        }
        // BF16 128.0 and 64.0: the int64 shapes cast into the model dtype.
        let bf = |v: u16| v.to_le_bytes();
        let pair = |a: u16, b: u16| [bf(a), bf(b)].concat().repeat(e_l);
        assert_eq!(
            t("w13_weight_shape").data,
            pair(0x4280, 0x4300),
            "{what}: w13_weight_shape"
        );
        assert_eq!(
            t("w2_weight_shape").data,
            pair(0x4300, 0x4280),
            "{what}: w2_weight_shape"
        );
        for j in 0..e_l {
            let e = first + j;
            let w13 = Mat::of_packed(&expert(t("w13_weight_packed"), j), 4, 1);
            let s13 = Mat::of_bf16(&expert(t("w13_weight_scale"), j));
            let w2 = Mat::of_packed(&expert(t("w2_weight_packed"), j), 4, 1);
            let s2 = Mat::of_bf16(&expert(t("w2_weight_scale"), j));
            parts[e][0][0].push(w13.rows(0, i_r));
            parts[e][1][0].push(w13.rows(i_r, 2 * i_r));
            parts[e][0][1].push(s13.rows(0, i_r));
            parts[e][1][1].push(s13.rows(i_r, 2 * i_r));
            parts[e][2][0].push(w2);
            parts[e][2][1].push(s2);
            if values[0][0].zero.is_some() {
                let z13 = Mat::of_packed(&expert(t("w13_weight_zero_point"), j), 4, 0);
                parts[e][0][2].push(z13.rows(0, i_r));
                parts[e][1][2].push(z13.rows(i_r, 2 * i_r));
                parts[e][2][2].push(Mat::of_packed(&expert(t("w2_weight_zero_point"), j), 4, 0));
            }
        }
    }
    for (e, per) in parts.iter().enumerate() {
        for (p, kinds) in per.iter().enumerate() {
            let v = &values[e][p];
            let whole = |ms: &[Mat]| {
                if p == 2 {
                    Mat::cat_cols(ms)
                } else {
                    Mat::cat_rows(ms)
                }
            };
            assert_eq!(
                whole(&kinds[0]),
                v.weight,
                "{what}: expert {e} proj {p} weight"
            );
            assert_eq!(
                whole(&kinds[1]),
                v.scale,
                "{what}: expert {e} proj {p} scale"
            );
            if let Some(z) = &v.zero {
                assert_eq!(
                    &whole(&kinds[2]),
                    z,
                    "{what}: expert {e} proj {p} zero point"
                );
            }
        }
    }
}

#[test]
fn int4_routed_experts_reassemble_and_everything_else_is_the_bf16_state() {
    for symmetric in [true, false] {
        let (dir, values) = checkpoint(symmetric);
        for (tp, ep) in [(1, false), (2, false), (2, true)] {
            check(dir.path(), &values, tp, ep);
        }
    }
}
