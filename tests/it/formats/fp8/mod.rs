//! FP8 checkpoints (`quant_method: fp8` and compressed-tensors FP8), checked by what a user relies
//! on rather than by wload's own formulas: every rank's FP8 weight, dequantized with that rank's
//! scales by an independent E4M3 decoder, is the bf16 weight real vLLM put on that rank of the
//! unquantized fixture (to within FP8 rounding); checkpoint kv scales land on the attention layer;
//! MoE expert scales (per-tensor Mixtral, block Qwen3-MoE under EP) and fused-on-disk scales sit
//! where vLLM's loaders put them; variants vLLM loads to the same state shard to the same bytes;
//! and what vLLM cannot load (unaligned blocks, half-quantized fused layers, missing or
//! unquantized tensors) or wload does not write (other quantization methods) is refused with
//! exit 3 before anything is written. The TP 2 golden cases (byte-identical to vLLM) run with the
//! other golden cases.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

use serde_json::{Value, json};
use tempfile::TempDir;
use xxhash_rust::xxh3::xxh3_64;

use crate::support::*;

mod dequantize;
mod expert_parallel;
mod fused_on_disk;
mod kv_scales;
mod loading;
mod mixtral;
mod qwen3_5;
mod refined_grid;
mod refusals;
mod spellings;
mod variants;

// ---------------------------------------------------------------------------------------------
// Reading tensors and FP8 values
// ---------------------------------------------------------------------------------------------

/// The tensors of one safetensors file, in header order.
fn file_tensors(path: &Path) -> Vec<(String, Held)> {
    let bytes = fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let base = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    header_tensors(path)
        .into_iter()
        .map(|t| {
            let data = bytes[base + t.start as usize..base + t.end as usize].to_vec();
            let held = Held {
                dtype: t.dtype,
                shape: t.shape,
                data,
            };
            (t.name, held)
        })
        .collect()
}

/// One FP8 E4M3 ("fn": no infinities, S.1111.111 is NaN) byte, decoded exactly: bias 7,
/// subnormals m/8·2^-6.
fn e4m3(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((b >> 3) & 0x0f);
    let man = f32::from(b & 0x07);
    if exp == 0x0f && b & 0x07 == 7 {
        return f32::NAN;
    }
    let mag = if exp == 0 {
        man / 8.0 * 2f32.powi(-6)
    } else {
        (1.0 + man / 8.0) * 2f32.powi(exp - 7)
    };
    sign * mag
}

/// A tensor's elements as f32 (F8_E4M3, BF16 and F32, the dtypes these checkpoints hold).
fn values(t: &Held) -> Vec<f32> {
    match t.dtype.as_str() {
        "F8_E4M3" => t.data.iter().map(|&b| e4m3(b)).collect(),
        "BF16" => t
            .data
            .chunks_exact(2)
            .map(|c| f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16))
            .collect(),
        "F32" => t
            .data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        other => panic!("no decoder for {other}"),
    }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn e4m3_decoder_knows_the_format() {
    // Values from the OCP FP8 spec (E4M3): max normal 448, min normal 2^-6, min subnormal 2^-9.
    for (byte, want) in [
        (0x00, 0.0),
        (0x38, 1.0),
        (0xb8, -1.0),
        (0x7e, 448.0),
        (0xfe, -448.0),
        (0x08, 2f32.powi(-6)),
        (0x01, 2f32.powi(-9)),
        (0x07, 7.0 * 2f32.powi(-9)),
        (0x3c, 1.5),
        (0x50, 8.0),
    ] {
        assert_eq!(e4m3(byte), want, "byte {byte:#04x}");
    }
    assert!(e4m3(0x7f).is_nan() && e4m3(0xff).is_nan());
}

/// Rewrites the single-file checkpoint `dir/model.safetensors` with `edit` applied to its
/// tensors (header order kept).
fn rewrite_model(dir: &Path, edit: impl FnOnce(&mut Vec<(String, Held)>)) {
    let path = dir.join("model.safetensors");
    let mut tensors = file_tensors(&path);
    edit(&mut tensors);
    write_held(&path, tensors.iter().map(|(n, t)| (n, t)));
}

fn edit_config(dir: &Path, edit: impl FnOnce(&mut Value)) {
    let path = dir.join("config.json");
    let mut config: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    edit(&mut config);
    write_json(&path, &config);
}

/// `wload shard SOURCE --tp TP` is refused with exit 3 and every one of `needles`, and the
/// output folder was never created. Returns stderr.
fn shard_refused(source: &Path, tp: u64, extra: &[&str], needles: &[&str]) -> String {
    let tmp = TempDir::new().unwrap();
    let out = tmp.path().join("out");
    let o = shard(source, tp, &out, extra);
    let err = assert_refusal_text(&o, 3, needles);
    assert!(
        !out.exists(),
        "{} --tp {tp}: refused, yet {} was created",
        source.display(),
        out.display()
    );
    err
}

/// A BF16 scalar with the bit pattern `bits`.
fn bf16_scalar(bits: u16) -> Held {
    Held {
        dtype: "BF16".into(),
        shape: vec![],
        data: bits.to_le_bytes().to_vec(),
    }
}

fn f32_scalar(v: f32) -> Held {
    Held {
        dtype: "F32".into(),
        shape: vec![],
        data: v.to_le_bytes().to_vec(),
    }
}

/// The low byte of every BF16 element: any F8_E4M3 bytes will do, and these can be predicted from
/// vLLM's bf16 shard of the same fixture.
fn low_bytes(bf16: &[u8]) -> Vec<u8> {
    bf16.iter().step_by(2).copied().collect()
}

fn f32_held(shape: &[u64], v: &[f32]) -> Held {
    Held {
        dtype: "F32".into(),
        shape: shape.to_vec(),
        data: f32_bytes(v),
    }
}

/// Each rank of `dir` equals vLLM's rank of `case` at TP 2, after `adjust` on vLLM's tensors.
fn assert_ranks_equal(dir: &Path, case: &str, adjust: impl Fn(u64, &mut Tensors)) {
    for r in 0..2 {
        let got = rank_tensors(dir, r);
        let mut want = rank_tensors(&expected(case, 2), r);
        adjust(r, &mut want);
        let (gk, wk): (BTreeSet<_>, BTreeSet<_>) = (got.keys().collect(), want.keys().collect());
        assert_eq!(gk, wk, "rank {r}: keys");
        for (name, w) in &want {
            assert!(&got[name] == w, "rank {r}: '{name}' differs");
        }
    }
}
