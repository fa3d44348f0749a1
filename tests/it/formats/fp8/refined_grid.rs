//! Expert block scales on vLLM's refined grid.

use super::*;

// ---------------------------------------------------------------------------------------------
// 6. Expert block scales on vLLM's refined grid
// ---------------------------------------------------------------------------------------------

/// A one-layer block-FP8 Qwen3-MoE (hidden 256, 4 experts of intermediate 256, 128×128 blocks,
/// attention and router left unquantized) whose expert scales at TP 4 need vLLM's refinement:
/// each rank's 64 rows are half a block, so the grid becomes 64×64 (vllm-spec §6.3).
fn refinable_qwen3_moe(dir: &Path) {
    const H: u64 = 256;
    const E: u64 = 4;
    const I: u64 = 256;
    write_json(
        &dir.join("config.json"),
        &json!({
            "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
            "hidden_size": H, "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 64,
            "num_experts": E, "num_experts_per_tok": 2, "moe_intermediate_size": I,
            "intermediate_size": 512, "vocab_size": 256, "num_hidden_layers": 1,
            "rms_norm_eps": 1e-6, "tie_word_embeddings": false, "dtype": "bfloat16",
            "quantization_config": {
                "quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128],
                "modules_to_not_convert": [
                    "lm_head", "model.layers.0.mlp.gate",
                    "model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj",
                    "model.layers.0.self_attn.v_proj", "model.layers.0.self_attn.o_proj"
                ]
            }
        }),
    );
    let l = "model.layers.0";
    let mut specs: Vec<(String, &str, Vec<u64>)> = vec![
        ("model.embed_tokens.weight".into(), "BF16", vec![256, H]),
        ("lm_head.weight".into(), "BF16", vec![256, H]),
        ("model.norm.weight".into(), "BF16", vec![H]),
        (format!("{l}.input_layernorm.weight"), "BF16", vec![H]),
        (
            format!("{l}.post_attention_layernorm.weight"),
            "BF16",
            vec![H],
        ),
        (format!("{l}.self_attn.q_norm.weight"), "BF16", vec![64]),
        (format!("{l}.self_attn.k_norm.weight"), "BF16", vec![64]),
        (format!("{l}.mlp.gate.weight"), "BF16", vec![E, H]),
    ];
    for p in ["q_proj", "k_proj", "v_proj", "o_proj"] {
        specs.push((format!("{l}.self_attn.{p}.weight"), "BF16", vec![H, H]));
    }
    for e in 0..E {
        for (p, shape) in [
            ("gate_proj", [I, H]),
            ("up_proj", [I, H]),
            ("down_proj", [H, I]),
        ] {
            let w = format!("{l}.mlp.experts.{e}.{p}");
            specs.push((format!("{w}.weight"), "F8_E4M3", shape.to_vec()));
            specs.push((
                format!("{w}.weight_scale_inv"),
                "F32",
                vec![shape[0].div_ceil(128), shape[1].div_ceil(128)],
            ));
        }
    }
    let data: Vec<Vec<u8>> = specs
        .iter()
        .enumerate()
        .map(|(t, (name, dtype, shape))| {
            let n: u64 = shape.iter().product();
            match *dtype {
                // Distinct scales: tensor number and element index.
                "F32" if name.ends_with("_scale_inv") => (0..n)
                    .flat_map(|k| (t as f32 * 100.0 + k as f32).to_le_bytes())
                    .collect(),
                "F8_E4M3" => (0..n)
                    .map(|k| (mix(t as u64 * 7919 + k) as u8) & 0x7E)
                    .collect(),
                _ => bf16_data(t as u64, n as usize),
            }
        })
        .collect();
    let tensors: Vec<Tensor> = specs
        .iter()
        .zip(&data)
        .map(|((n, d, s), bytes)| (n.as_str(), *d, s.as_slice(), bytes.as_slice()))
        .collect();
    write_safetensors(&dir.join("model.safetensors"), &tensors);
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// At TP 4 every rank's expert scales are the checkpoint's, upsampled ×2 both ways
/// (`repeat_interleave`, routed_experts.py:950–960) and cut at the rank's rows (w13) or columns
/// (w2); at TP 2 the checkpoint's blocks fit and are cut as they are.
#[test]
fn expert_block_scales_follow_vllms_refined_grid() {
    let tmp = TempDir::new().unwrap();
    let src = tmp.path().join("src");
    fs::create_dir(&src).unwrap();
    refinable_qwen3_moe(&src);
    let ck = checkpoint_tensors(&src);
    let scale = |e: u64, p: &str| {
        f32s(&ck[&format!("model.layers.0.mlp.experts.{e}.{p}.weight_scale_inv")].data)
    };
    // The checkpoint's [2, 2] scales upsampled to [4, 4]: element (i, c) is scale (i/2, c/2).
    let up = |s: &[f32], i: usize, c: usize| s[(i / 2) * 2 + c / 2];
    let out = tmp.path().join("tp4");
    shard_ok(&src, 4, &out, &["-q"]);
    let key = |p: &str| format!("model.layers.0.mlp.experts.routed_experts.{p}_weight_scale_inv");
    for r in 0..4usize {
        let got = rank_tensors(&out, r as u64);
        let w13 = &got[&key("w13")];
        let w2 = &got[&key("w2")];
        assert_eq!(
            (w13.shape.clone(), w2.shape.clone()),
            (vec![4, 2, 4], vec![4, 4, 1]),
            "rank {r}"
        );
        let (w13, w2) = (f32s(&w13.data), f32s(&w2.data));
        for e in 0..4u64 {
            let j = e as usize;
            for (h, p) in ["gate_proj", "up_proj"].iter().enumerate() {
                let s = scale(e, p);
                for c in 0..4 {
                    // One refined row per rank and shard: upsampled row r.
                    assert_eq!(
                        w13[(j * 2 + h) * 4 + c],
                        up(&s, r, c),
                        "rank {r} expert {e} {p} col {c}"
                    );
                }
            }
            let s = scale(e, "down_proj");
            for i in 0..4 {
                assert_eq!(
                    w2[j * 4 + i],
                    up(&s, i, r),
                    "rank {r} expert {e} down row {i}"
                );
            }
        }
    }
    // TP 2: 128 rows per rank, whole blocks, no refinement: w13 [4, 2, 2], w2 [4, 2, 1].
    let out2 = tmp.path().join("tp2");
    shard_ok(&src, 2, &out2, &["-q"]);
    let got = rank_tensors(&out2, 1);
    assert_eq!(got[&key("w13")].shape, vec![4, 2, 2]);
    assert_eq!(got[&key("w2")].shape, vec![4, 2, 1]);
    assert_eq!(f32s(&got[&key("w2")].data)[0], scale(0, "down_proj")[1]);
}
