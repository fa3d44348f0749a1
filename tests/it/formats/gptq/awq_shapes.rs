//! AWQ on the shapes real vLLM 0.33 was verified with (spec §10.1 item 3, `qwen2_awq` TP 2:
//! hidden 128, 8 heads and 2 kv heads of 16, groups of 32): `qkv_proj.qweight [128, 12]` (q 8 +
//! k 2 + v 2 words), `qzeros [4, 12]`, `scales [4, 96]`, `o_proj.qweight [64, 16]`,
//! `qzeros [2, 16]`, `scales [2, 128]`, and the qkv bias F16 `[q_r | k_r | v_r]`.

use super::*;

fn qwen2_awq() -> TempDir {
    let tmp = TempDir::new().unwrap();
    write_json(
        &tmp.path().join("config.json"),
        &json!({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
            "hidden_size": 128, "num_attention_heads": 8, "num_key_value_heads": 2,
            "intermediate_size": 256, "vocab_size": 64, "num_hidden_layers": 1,
            "rms_norm_eps": 1e-6, "tie_word_embeddings": false, "torch_dtype": "float16",
            "max_position_embeddings": 256,
            "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 32,
                "zero_point": true, "version": "gemm", "modules_to_not_convert": null}}),
    );
    let l = "model.layers.0";
    let mut specs: Vec<(String, &str, Vec<u64>)> = vec![
        ("model.embed_tokens.weight".into(), "F16", vec![64, 128]),
        ("lm_head.weight".into(), "F16", vec![64, 128]),
        ("model.norm.weight".into(), "F16", vec![128]),
        (format!("{l}.input_layernorm.weight"), "F16", vec![128]),
        (
            format!("{l}.post_attention_layernorm.weight"),
            "F16",
            vec![128],
        ),
    ];
    let linears = [
        ("self_attn.q_proj", 128, 128),
        ("self_attn.k_proj", 128, 32),
        ("self_attn.v_proj", 128, 32),
        ("self_attn.o_proj", 128, 128),
        ("mlp.gate_proj", 128, 256),
        ("mlp.up_proj", 128, 256),
        ("mlp.down_proj", 256, 128),
    ];
    for (m, k, n) in linears {
        specs.extend(packed(Method::Awq, &format!("{l}.{m}"), k, n, 32));
        if m.ends_with("q_proj") || m.ends_with("k_proj") || m.ends_with("v_proj") {
            specs.push((format!("{l}.{m}.bias"), "F16", vec![n]));
        }
    }
    write_specs(&tmp.path().join("model.safetensors"), &specs);
    tmp
}

#[test]
fn awq_rank_shapes_are_the_ones_real_vllm_holds() {
    let src = qwen2_awq();
    let out = sharded(src.path(), 2, &[]);
    let ckpt = checkpoint_tensors(src.path());
    let at = |n: &str| format!("model.layers.0.self_attn.{n}");
    for r in 0..2u64 {
        let t = rank_tensors(&out.path().join("out"), r);
        for (name, dtype, shape) in [
            ("qkv_proj.qweight", "I32", [128, 12]),
            ("qkv_proj.qzeros", "I32", [4, 12]),
            ("qkv_proj.scales", "F16", [4, 96]),
            ("o_proj.qweight", "I32", [64, 16]),
            ("o_proj.qzeros", "I32", [2, 16]),
            ("o_proj.scales", "F16", [2, 128]),
        ] {
            let h = &t[&at(name)];
            assert_eq!(
                (h.dtype.as_str(), &h.shape[..]),
                (dtype, &shape[..]),
                "rank {r} {name}"
            );
        }
        let bias = &t[&at("qkv_proj.bias")];
        let part = |m: &str, from: usize, to: usize| {
            let b = &ckpt[&at(&format!("{m}.bias"))];
            b.data[from * 2..to * 2].to_vec()
        };
        let r = r as usize;
        let want: Vec<u8> = [
            part("q_proj", 64 * r, 64 * (r + 1)),
            part("k_proj", 16 * r, 16 * (r + 1)),
            part("v_proj", 16 * r, 16 * (r + 1)),
        ]
        .concat();
        assert_eq!(
            (bias.dtype.as_str(), &bias.shape[..]),
            ("F16", &[96u64][..])
        );
        assert!(bias.data == want, "rank {r}: qkv bias [q_r | k_r | v_r]");
    }
}
