//! Block FP8 on Qwen3.5-MoE (the golden `qwen3_5_moe` fixture, quantized here): `in_proj_qkvz`,
//! filled by `in_proj_qkv` as the tuple shard `(0, 1, 2)` and `in_proj_z` as shard 3, holds on rank
//! r `[q_r; k_r; v_r; z_r]` of FP8 rows and, as `weight_scale_inv`, the block rows vLLM 0.33's
//! `MergedColumnParallelLinear.weight_loader_v2` takes: the tuple's scale cut at the shards'
//! block-rounded sizes (`adjust_block_scale_shard`), each part then sliced by whole blocks per
//! rank. `in_proj_a` / `in_proj_b`, listed under their checkpoint names in
//! `modules_to_not_convert` (`Fp8Config.apply_vllm_mapper` maps them), stay BF16 without scales.
//!
//! Checked against real vLLM 0.33 on the CPU, on the same quantization with real E4M3 values
//! (block 16 at TP 2, block 8 at TP 4; vision tower, routers, `in_proj_a/b` and `lm_head` in
//! `modules_to_not_convert`): `tools/vllm_reload.py --load-format safetensors FOLDER --tp N
//! --language-model-only --dump DUMP` (with `quantization.fp8.init_fp8_linear_kernel` stubbed,
//! selection only), `wload shard FOLDER --tp N --language-model-only -o OUT`, then
//! `compare_shards.py DUMP OUT --ignore-parts`: "IDENTICAL: 2 ranks, 184 tensors" and
//! "IDENTICAL: 4 ranks, 368 tensors"; Qwen3-Next built from the same tensors (fused on disk,
//! `in_proj_ba` ignored) at TP 2: "IDENTICAL: 2 ranks, 184 tensors". Block 32 at TP 2 is refused by
//! both (vLLM: "Weight input_size_per_partition = 16 is not divisible by weight quantization
//! block_k = 32.", the shared expert's down_proj).

use super::*;

const CASE: &str = "qwen3_5_moe";
const LM: &str = "--language-model-only";
/// The fixture's GDN sizes: key = 4 heads · 16, value = 8 heads · 16, hidden 128.
const KEY: usize = 64;
const VALUE: usize = 128;

/// Whether vLLM builds the checkpoint linear `name` with the FP8 method (what Qwen's releases
/// quantize): the GDN qkv/z/out projections, attention, experts, shared expert.
fn quantized(name: &str) -> bool {
    let Some(m) = name.strip_suffix(".weight") else {
        return false;
    };
    m.starts_with("model.language_model.layers.")
        && [
            ".linear_attn.in_proj_qkv",
            ".linear_attn.in_proj_z",
            ".linear_attn.out_proj",
            "_proj",
        ]
        .iter()
        .any(|e| m.ends_with(e))
        && !m.ends_with("in_proj_a")
        && !m.ends_with("in_proj_b")
}

/// The fixture with every quantized weight as F8_E4M3 (its bytes a function of the name) and an
/// F32 `weight_scale_inv` per `bn`×`bn` block, each block's value distinct.
fn fp8_fixture(bn: usize) -> TempDir {
    let mut t = checkpoint_tensors(&fixture(CASE));
    let mut next = 1.0f32;
    let names: Vec<String> = t.keys().filter(|n| quantized(n)).cloned().collect();
    for name in names {
        let w = &t[&name];
        let (rows, cols) = (w.shape[0] as usize, w.shape[1] as usize);
        let seed = xxh3_64(name.as_bytes());
        let data = (0..rows * cols)
            .map(|i| (mix(seed ^ i as u64) % 0x7e) as u8)
            .collect();
        let blocks = [rows.div_ceil(bn), cols.div_ceil(bn)];
        let scale = (0..blocks[0] * blocks[1])
            .flat_map(|_| {
                next += 1.0;
                next.to_le_bytes()
            })
            .collect();
        t.insert(name.clone(), Held::new("F8_E4M3", &[rows, cols], data));
        let s = format!("{}_scale_inv", name);
        t.insert(s, Held::new("F32", &blocks, scale));
    }
    let mut cfg: Value =
        serde_json::from_slice(&fs::read(fixture(CASE).join("config.json")).unwrap()).unwrap();
    let mut skip = vec!["lm_head".to_string()];
    for n in t.keys().filter(|n| n.starts_with("model.visual.")) {
        if let Some(m) = n.strip_suffix(".weight")
            && t[n].shape.len() == 2
        {
            skip.push(m.to_string());
        }
    }
    for i in 0..4 {
        let p = format!("model.language_model.layers.{i}");
        skip.extend([
            format!("{p}.mlp.gate"),
            format!("{p}.mlp.shared_expert_gate"),
        ]);
        if i < 3 {
            skip.extend(["a", "b"].map(|x| format!("{p}.linear_attn.in_proj_{x}")));
        }
    }
    cfg["quantization_config"] = json!({"quant_method": "fp8", "activation_scheme": "dynamic",
        "weight_block_size": [bn, bn], "modules_to_not_convert": skip});
    write_checkpoint(&cfg, &t)
}

/// Rank r's rows of each of a merged column's parts: part k of `sizes`, held in `src[k]` from row
/// `off[k]`, contributes rows `off[k] + r·sizes[k]/tp ..` of it (sizes in rows of `src`'s unit).
fn merged_rows(src: &[&Held], off: &[usize], sizes: &[usize], r: usize, tp: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for k in 0..sizes.len() {
        let n = sizes[k] / tp;
        out.extend_from_slice(src[k].rows(off[k] + r * n, off[k] + (r + 1) * n));
    }
    out
}

/// TP 2 with 16×16 blocks and TP 4 with 8×8 blocks (the fixture's key size is 64: at TP 4 a
/// key part is 16 rows, not whole 16-row blocks, which vLLM cannot load).
#[test]
fn qwen3_5_in_proj_qkvz_block_scales_follow_vllms_tuple_loader() {
    for (tp, bn) in [(2usize, 16usize), (4, 8)] {
        let src = fp8_fixture(bn);
        let ck = checkpoint_tensors(src.path());
        let tmp = TempDir::new().unwrap();
        shard_ok(src.path(), tp as u64, tmp.path(), &["-q", LM]);
        let p = "model.language_model.layers.0.linear_attn.";
        let (qkv, z) = (
            &ck[&format!("{p}in_proj_qkv.weight")],
            &ck[&format!("{p}in_proj_z.weight")],
        );
        let qkv_s = &ck[&format!("{p}in_proj_qkv.weight_scale_inv")];
        let z_s = &ck[&format!("{p}in_proj_z.weight_scale_inv")];
        let sizes = [KEY, KEY, VALUE, VALUE];
        let blocks = sizes.map(|s| s / bn);
        for r in 0..tp {
            let ctx = format!("tp{tp} block {bn} rank {r}");
            let got = rank_tensors(tmp.path(), r as u64);
            let q = "language_model.model.layers.0.linear_attn.in_proj_qkvz.";
            let rows = (2 * KEY + 2 * VALUE) / tp;
            let w = merged_rows(&[qkv, qkv, qkv, z], &[0, KEY, 2 * KEY, 0], &sizes, r, tp);
            assert_tensor(
                &got,
                &format!("{q}weight"),
                "F8_E4M3",
                &[rows, 128],
                &w,
                &ctx,
            );
            let (b0, b1) = (blocks[0], blocks[1]);
            let s = merged_rows(
                &[qkv_s, qkv_s, qkv_s, z_s],
                &[0, b0, b0 + b1, 0],
                &blocks,
                r,
                tp,
            );
            let shape = [rows / bn, 128 / bn];
            assert_tensor(
                &got,
                &format!("{q}weight_scale_inv"),
                "F32",
                &shape,
                &s,
                &ctx,
            );
            let ba = "language_model.model.layers.0.linear_attn.in_proj_ba.";
            assert_eq!(got[&format!("{ba}weight")].dtype, "BF16", "{ctx}");
            assert!(!got.contains_key(&format!("{ba}weight_scale_inv")), "{ctx}");
        }
    }
}
