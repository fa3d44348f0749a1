//! Variants of the per-tensor checkpoint that vLLM loads to the same state.

use super::*;

// ---------------------------------------------------------------------------------------------
// 6. Variants of the per-tensor checkpoint that vLLM loads to the same state
// ---------------------------------------------------------------------------------------------

/// Scales saved as `[1]` (as some exporters do) load into the same slots as scalars `[]`.
#[test]
fn per_tensor_scales_of_shape_1_shard_like_scalars() {
    let src = copy_fixture("llama_gqa_fp8_tensor");
    rewrite_model(src.path(), |t| {
        for (name, held) in t.iter_mut() {
            if name.ends_with("_scale") {
                held.shape = vec![1];
            }
        }
    });
    let tmp = TempDir::new().unwrap();
    let out = tmp.path().join("out");
    shard_ok(src.path(), 2, &out, &["-q"]);
    assert_ranks_equal(&out, "llama_gqa__fp8_tensor", |_, _| {});
}

/// Layer 0's q, k and v kept in BF16 and listed in `ignored_layers`: vLLM builds that qkv_proj
/// unquantized (a BF16 weight, no scales), everything else as in the FP8 checkpoint.
#[test]
fn a_wholly_ignored_fused_layer_stays_bf16_without_scales() {
    let src = copy_fixture("llama_gqa_fp8_tensor");
    let bf16 = checkpoint_tensors(&fixture(GQA));
    let ignored = ["q_proj", "k_proj", "v_proj"].map(|p| format!("model.layers.0.self_attn.{p}"));
    rewrite_model(src.path(), |t| {
        t.retain(|(n, _)| !ignored.iter().any(|m| n.starts_with(&format!("{m}."))));
        for m in &ignored {
            let name = format!("{m}.weight");
            t.push((name.clone(), bf16[&name].clone()));
        }
    });
    edit_config(src.path(), |c| {
        c["quantization_config"]["ignored_layers"] = json!(ignored);
    });
    let tmp = TempDir::new().unwrap();
    let out = tmp.path().join("out");
    shard_ok(src.path(), 2, &out, &["-q"]);
    let qkv = "model.layers.0.self_attn.qkv_proj";
    assert_ranks_equal(&out, "llama_gqa__fp8_tensor", |r, want| {
        want.remove(&format!("{qkv}.weight_scale"));
        want.remove(&format!("{qkv}.input_scale"));
        let name = format!("{qkv}.weight");
        want.insert(
            name.clone(),
            rank_tensors(&expected(GQA, 2), r)[&name].clone(),
        );
    });
}

/// compressed-tensors with the `tensor` weight strategy and static input scales holds the same
/// per-tensor slot vectors as `quant_method: fp8`; only the attention differs (compressed-tensors'
/// KV cache method: F32 `[1]` scales and BF16 zero points, no prob_scale), as in vLLM's
/// compressed-tensors channel output.
#[test]
fn compressed_tensors_tensor_strategy_matches_fp8_per_tensor() {
    let src = copy_fixture("llama_gqa_fp8_tensor");
    rewrite_model(src.path(), |t| {
        for (name, held) in t.iter_mut() {
            if name.ends_with("_scale") {
                held.shape = vec![1];
            }
        }
    });
    edit_config(src.path(), |c| {
        c["quantization_config"] = json!({
            "quant_method": "compressed-tensors",
            "format": "float-quantized",
            "quantization_status": "compressed",
            "ignore": ["lm_head"],
            "kv_cache_scheme": null,
            "config_groups": {"group_0": {
                "targets": ["Linear"],
                "weights": {"type": "float", "num_bits": 8, "strategy": "tensor",
                            "symmetric": true, "dynamic": false},
                "input_activations": {"type": "float", "num_bits": 8, "strategy": "tensor",
                                      "symmetric": true, "dynamic": false}
            }}
        });
    });
    let tmp = TempDir::new().unwrap();
    let out = tmp.path().join("out");
    shard_ok(src.path(), 2, &out, &["-q"]);
    assert_ranks_equal(&out, "llama_gqa__fp8_tensor", |r, want| {
        let ct = rank_tensors(&expected("llama_gqa_ct_fp8_dynamic", 2), r);
        want.retain(|n, _| !n.contains(".attn.") || n.contains(".attn._"));
        want.extend(
            ct.into_iter()
                .filter(|(n, _)| n.contains(".attn.") && !n.contains(".attn._")),
        );
    });
}
