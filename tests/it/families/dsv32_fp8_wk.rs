//! DeepSeek-V3.2 checkpoints whose indexer `wk` is FP8 (block-FP8 releases): vLLM dequantizes
//! it while loading and fills shard 0 of the BF16 `wk_weights_proj` with it.
//!
//! Verified against real vLLM 0.33 (CPU, the CUDA module tree, `tools/vllm_reload.py
//! --load-format safetensors --tp 2`): the golden `deepseek_v32` fixture with each layer's
//! `indexer.wk.weight` [32, 128] made F8_E4M3 plus `weight_scale_inv` — F32 [2, 4] (16×32
//! blocks), BF16 [32] (per row), U8 E8M0 [32, 4] (MX, every E4M3 code once, NaNs included), F32
//! [1, 1] — and no quantization_config: wload's TP2 output was byte-identical to vLLM's state
//! (compare_shards.py `IDENTICAL: 2 ranks, 86 tensors`). vLLM computes
//! `(w.float() * scale.float()).to(torch.bfloat16)` (`scaled_dequantize`, deepseek_v2.py:902),
//! the scale broadcast over `[out / s0, in / s1]` blocks, E8M0 decoded as 2^(x-127); torch's
//! vectorized CPU cast rounds to nearest even and makes every NaN 0xFFFF.
//!
//! The expected rows here are computed by the test itself, not by wload's code.

use std::fs;

use serde_json::Value;
use tempfile::TempDir;

use crate::support::*;

const DSV32: &str = "deepseek_v32";
const OUT: usize = 32; // index_head_dim
const IN: usize = 128; // hidden_size

fn wk(i: usize) -> String {
    format!("model.layers.{i}.self_attn.indexer.wk.weight")
}

/// E4M3 (fn) by its definition: bias 7, subnormals at exponent 0, S.1111.111 NaN.
fn e4m3(b: u8) -> f32 {
    let (e, m) = ((b >> 3) & 15, b & 7);
    let mag = if e == 15 && m == 7 {
        f32::NAN
    } else if e == 0 {
        f32::from(m) / 8.0 / 64.0
    } else {
        (1.0 + f32::from(m) / 8.0) * 2f32.powi(i32::from(e) - 7)
    };
    if b & 0x80 != 0 { -mag } else { mag }
}

/// Round to nearest even by halves: the bf16 below and above, the nearer (the even on a tie).
fn bf16(x: f32) -> u16 {
    if x.is_nan() {
        return 0xFFFF;
    }
    let bits = x.to_bits();
    let (lo, rest) = ((bits >> 16) as u16, bits & 0xFFFF);
    let up = rest > 0x8000 || (rest == 0x8000 && lo & 1 == 1);
    lo + u16::from(up)
}

/// A scale tensor's values as F32.
fn scale_values(s: &Held) -> Vec<f32> {
    match s.dtype.as_str() {
        "F32" => (s.data.chunks(4))
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        "BF16" => (s.data.chunks(2))
            .map(|c| f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16))
            .collect(),
        "U8" => s
            .data
            .iter()
            .map(|&x| 2f32.powi(i32::from(x) - 127))
            .collect(),
        other => panic!("{other}"),
    }
}

/// The BF16 bytes vLLM makes of FP8 `w` [OUT, IN] and its scale.
fn dequantized(w: &Held, s: &Held) -> Vec<u8> {
    let vals = scale_values(s);
    let (g0, g1, per_row) = match s.shape[..] {
        [n] => (OUT / n as usize, IN, 1),
        [a, b] => (OUT / a as usize, IN / b as usize, b as usize),
        _ => panic!("scale shape"),
    };
    (0..OUT * IN)
        .flat_map(|k| {
            let (r, c) = (k / IN, k % IN);
            let x = e4m3(w.data[k]) * vals[(r / g0) * per_row + c / g1];
            bf16(x).to_le_bytes()
        })
        .collect()
}

/// The fixture with layer `i`'s wk FP8 (its BF16 bytes' high byte, sign kept, the top exponent
/// bit cleared: finite codes) and a scale of `dtype` and `shape`; `all_codes` puts every E4M3
/// code, the NaNs too, in its first 256 elements.
fn fp8_wk(layers: &[(&str, &[usize])], all_codes: bool) -> TempDir {
    let mut ck = checkpoint_tensors(&fixture(DSV32));
    for (i, &(dtype, shape)) in layers.iter().enumerate() {
        let w = ck.get_mut(&wk(i)).unwrap();
        w.data = w.data.iter().skip(1).step_by(2).map(|b| b & 0xBF).collect();
        if all_codes {
            w.data[..256].copy_from_slice(&(0..=255u8).collect::<Vec<_>>());
        }
        w.dtype = "F8_E4M3".into();
        let n: usize = shape.iter().product();
        let data: Vec<u8> = match dtype {
            "F32" => (0..n)
                .flat_map(|k| (0.001 * (k as f32 + 1.0) / 3.0).to_le_bytes())
                .collect(),
            "BF16" => (0..n)
                .flat_map(|k| (0x3A00u16 + 37 * k as u16).to_le_bytes())
                .collect(),
            _ => (0..n).map(|k| 110 + (k % 20) as u8).collect(),
        };
        ck.insert(
            format!("{}_scale_inv", wk(i)),
            Held::new(dtype, shape, data),
        );
    }
    let text = fs::read(fixture(DSV32).join("config.json")).unwrap();
    let cfg: Value = serde_json::from_slice(&text).unwrap();
    write_checkpoint(&cfg, &ck)
}

fn check(src: &TempDir) {
    let ck = checkpoint_tensors(src.path());
    let tmp = TempDir::new().unwrap();
    shard_ok(src.path(), 2, tmp.path(), &["-q"]);
    for r in 0..2 {
        let got = rank_tensors(tmp.path(), r);
        for i in 0..2 {
            let fused = format!("model.layers.{i}.self_attn.indexer.wk_weights_proj.weight");
            let t = &got[&fused];
            assert_eq!((t.dtype.as_str(), &t.shape[..]), ("BF16", &[36, 128][..]));
            let want = dequantized(&ck[&wk(i)], &ck[&format!("{}_scale_inv", wk(i))]);
            assert!(t.rows(0, OUT) == &want[..], "rank {r} layer {i}: wk rows");
            let wp = &ck[&format!("model.layers.{i}.self_attn.indexer.weights_proj.weight")];
            assert_eq!(
                t.rows(OUT, 36),
                &wp.data[..],
                "rank {r} layer {i}: weights_proj"
            );
            let scale = format!("{fused}_scale_inv");
            assert!(!got.contains_key(&scale), "{scale}");
        }
    }
}

/// 2-D block scales (F32 [2, 4]: 16×32 blocks) and a per-row BF16 scale.
#[test]
fn deepseek_v32_fp8_wk_block_and_per_row_scales() {
    check(&fp8_wk(&[("F32", &[2, 4]), ("BF16", &[32])], false));
}

/// MX E8M0 scales as U8 [32, 4] (`in / 32`) over every E4M3 code, and one [1, 1] F32 block.
#[test]
fn deepseek_v32_fp8_wk_mx_scales_every_code() {
    check(&fp8_wk(&[("U8", &[32, 4]), ("F32", &[1, 1])], true));
}

/// A scale vLLM's `scaled_dequantize` cannot broadcast (3 rows over 32), or none, is refused
/// before any data is read.
#[test]
fn deepseek_v32_fp8_wk_bad_or_missing_scale_refused() {
    let src = fp8_wk(&[("F32", &[3, 4]), ("F32", &[1, 1])], false);
    let o = run(&["plan", s(src.path()), "--tp", "2"]);
    assert_refusal_text(
        &o,
        3,
        &["has shape [3, 4], which does not divide FP8 tensor"],
    );
    let src = fp8_wk(&[("F32", &[1, 1]), ("F32", &[1, 1])], false);
    let p = src.path().join("model.safetensors");
    let mut ck = checkpoint_tensors(src.path());
    ck.remove(&format!("{}_scale_inv", wk(1)));
    write_held(&p, &ck);
    let o = run(&["plan", s(src.path()), "--tp", "2"]);
    assert_refusal_text(
        &o,
        3,
        &["has no 'model.layers.1.self_attn.indexer.wk.weight_scale_inv'"],
    );
}

/// The other sinks take the same reduction: `shard --verify` reads the dequantized rows back,
/// and `load --device cpu` of the FP8 checkpoint holds what it holds of the shard output.
#[test]
fn deepseek_v32_fp8_wk_verify_and_load_agree() {
    let src = fp8_wk(&[("F32", &[2, 4]), ("U8", &[32, 4])], true);
    let tmp = TempDir::new().unwrap();
    shard_ok(src.path(), 2, tmp.path(), &["-q", "--verify"]);
    let sums = |dir: &std::path::Path| {
        let o = run(&[
            "load",
            s(dir),
            "--tp",
            "2",
            "--device",
            "cpu",
            "--checksums",
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let text = String::from_utf8_lossy(&o.stdout).into_owned();
        let lines: Vec<String> = (text.lines())
            .filter(|l| l.contains("wk_weights_proj"))
            .map(str::to_owned)
            .collect();
        assert_eq!(lines.len(), 4, "{text}");
        lines
    };
    assert_eq!(sums(src.path()), sums(tmp.path()));
}

/// A `wk.weight_scale_inv` beside a BF16 `wk`: vLLM buffers the scale for an FP8 weight that
/// never comes and loads `wk` as it is (checked with real vLLM 0.33 as above: byte-identical).
#[test]
fn deepseek_v32_scale_of_a_bf16_wk_is_skipped() {
    let mut ck = checkpoint_tensors(&fixture(DSV32));
    let scale = format!("{}_scale_inv", wk(0));
    ck.insert(
        scale.clone(),
        Held::new("F32", &[1, 1], 1f32.to_le_bytes().to_vec()),
    );
    let text = fs::read(fixture(DSV32).join("config.json")).unwrap();
    let src = write_checkpoint(&serde_json::from_slice(&text).unwrap(), &ck);
    let o = run(&["plan", s(src.path()), "--tp", "2", "--json"]);
    let plan: Value = json_doc(&["plan"], &o);
    let skipped: Vec<&str> = (plan["skipped"].as_array().unwrap().iter())
        .filter(|t| t["tensor"] == scale.as_str())
        .map(|t| t["reason"].as_str().unwrap())
        .collect();
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    assert!(skipped[0].contains("unused"), "{skipped:?}");
    let tmp = TempDir::new().unwrap();
    shard_ok(src.path(), 2, tmp.path(), &["-q"]);
    let got = rank_tensors(tmp.path(), 1);
    let fused = &got["model.layers.0.self_attn.indexer.wk_weights_proj.weight"];
    assert_eq!(fused.rows(0, OUT), &ck[&wk(0)].data[..]);
}
