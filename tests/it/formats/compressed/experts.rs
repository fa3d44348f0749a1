//! Pack-quantized routed experts on the DeepSeek-V3 architecture (Kimi-K2 style: int4 group 32,
//! attention, shared experts and the dense layer left BF16 by `ignore`): every non-expert tensor
//! is what the BF16 checkpoint gives, byte for byte, and every rank's packed experts, unpacked
//! and put back together, are the checkpoint's — at TP 1 and 2 and under EP 2; and the same for
//! a tiny Qwen3-MoE.

use std::path::Path;

use serde_json::{Value, json};

use super::wna16::Mat;
use super::{Rng, pack, wna16_config};
use crate::support::*;

/// A MoE model: where its bf16 checkpoint is, its routed experts' module and sizes, the group
/// size and what stays unquantized.
struct Moe {
    source: std::path::PathBuf,
    prefix: &'static str,
    e: usize,
    i: usize,
    h: usize,
    g: usize,
    ignore: serde_json::Value,
}

fn deepseek_v3() -> Moe {
    Moe {
        source: fixture("deepseek_v3"),
        prefix: "model.layers.1.mlp.experts",
        e: 8,
        i: 64,
        h: 128,
        g: 32,
        ignore: json!([
            "lm_head",
            "re:.*self_attn.*",
            "re:.*shared_experts.*",
            "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"
        ]),
    }
}

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
fn checkpoint(m: &Moe, symmetric: bool) -> (tempfile::TempDir, Vec<Vec<Values>>) {
    let qc = wna16_config(4, Some(m.g as u64), symmetric, m.ignore.clone());
    let dir = tempfile::tempdir().unwrap();
    for f in std::fs::read_dir(&m.source).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, dir.path().join(f.file_name().unwrap())).unwrap();
    }
    let mut config: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("config.json")).unwrap()).unwrap();
    config["quantization_config"] = qc;
    write_json(&dir.path().join("config.json"), &config);
    let kept = checkpoint_tensors(dir.path());
    let mut owned: Vec<(String, String, Vec<u64>, Vec<u8>)> = (kept.into_iter())
        .filter(|(n, _)| !n.starts_with(&format!("{}.", m.prefix)))
        .map(|(n, h)| (n, h.dtype, h.shape, h.data))
        .collect();
    let mut rng = Rng::new(11 + u64::from(symmetric));
    let mut values = Vec::new();
    for e in 0..m.e {
        let mut per = Vec::new();
        for (p, n, k) in [
            ("gate_proj", m.i, m.h),
            ("up_proj", m.i, m.h),
            ("down_proj", m.h, m.i),
        ] {
            let name = format!("{}.{e}.{p}", m.prefix);
            let w = rng.values(n * k, 4);
            let scale = rng.bf16(n * (k / m.g));
            let shape = |v: &[usize]| v.iter().map(|&x| x as u64).collect::<Vec<u64>>();
            owned.push((
                format!("{name}.weight_packed"),
                "I32".into(),
                shape(&[n, k / 8]),
                pack(&w, n, k, 4, 1),
            ));
            let held = Held {
                dtype: "BF16".into(),
                shape: shape(&[n, k / m.g]),
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
            let zero = (!symmetric).then(|| rng.values(n * (k / m.g), 4));
            if let Some(z) = &zero {
                owned.push((
                    format!("{name}.weight_zero_point"),
                    "I32".into(),
                    shape(&[n / 8, k / m.g]),
                    pack(z, n, k / m.g, 4, 0),
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
                    cols: k / m.g,
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
fn check(m: &Moe, quantized: &Path, values: &[Vec<Values>], tp: u64, ep: bool) {
    let extra: &[&str] = if ep {
        &["--enable-expert-parallel"]
    } else {
        &[]
    };
    let (plain, out) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    shard_ok(&m.source, tp, plain.path(), extra);
    shard_ok(quantized, tp, out.path(), extra);
    let what = format!("tp{tp} ep {ep}");
    let base = format!("{}.routed_experts.", m.prefix);
    let mut parts: Vec<Vec<[Vec<Mat>; 3]>> = (0..m.e)
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
        let e_l = if ep { m.e / tp as usize } else { m.e };
        let first = if ep { r as usize * e_l } else { 0 };
        let i_r = if ep { m.i } else { m.i / tp as usize };
        let t = |n: &str| {
            got.get(&format!("{base}{n}"))
                .unwrap_or_else(|| panic!("{what}: no {n}"))
        };
        for (n, dtype, shape) in [
            ("w13_weight_packed", "I32", vec![e_l, 2 * i_r, m.h / 8]),
            ("w2_weight_packed", "I32", vec![e_l, m.h, i_r / 8]),
            ("w13_weight_scale", "BF16", vec![e_l, 2 * i_r, m.h / m.g]),
            ("w2_weight_scale", "BF16", vec![e_l, m.h, i_r / m.g]),
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
        // The int64 shapes cast into the model dtype (BF16 holds these integers exactly).
        let bf = |v: usize| ((v as f32).to_bits() >> 16) as u16;
        let pair = |a: u16, b: u16| [a.to_le_bytes(), b.to_le_bytes()].concat().repeat(e_l);
        assert_eq!(
            t("w13_weight_shape").data,
            pair(bf(m.i), bf(m.h)),
            "{what}: w13_weight_shape"
        );
        assert_eq!(
            t("w2_weight_shape").data,
            pair(bf(m.h), bf(m.i)),
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
    let m = deepseek_v3();
    for symmetric in [true, false] {
        let (dir, values) = checkpoint(&m, symmetric);
        for (tp, ep) in [(1, false), (2, false), (2, true)] {
            check(&m, dir.path(), &values, tp, ep);
        }
    }
}

/// Qwen3-MoE's experts take the same parameters (two experts of 8 × 16, group 8: whole
/// packed words only at TP 1, or with experts whole under EP).
#[test]
fn qwen3_moe_int4_experts_reassemble_too() {
    let tiny = tiny_qwen3_moe();
    let m = Moe {
        source: tiny.path().to_path_buf(),
        prefix: "model.layers.0.mlp.experts",
        e: 2,
        i: 8,
        h: 16,
        g: 8,
        ignore: json!(["lm_head", "re:.*self_attn.*", "re:.*mlp\\.gate$"]),
    };
    for symmetric in [true, false] {
        let (dir, values) = checkpoint(&m, symmetric);
        for (tp, ep) in [(1, false), (2, true)] {
            check(&m, dir.path(), &values, tp, ep);
        }
    }
}
