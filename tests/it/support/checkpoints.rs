//! Small checkpoints built in temp folders.

use std::path::Path;

use serde_json::{Value, json};
use tempfile::TempDir;

use super::{Tensor, write_raw, write_safetensors};

/// A config.json for a tiny Llama: 1 layer, hidden 8, 2 heads, vocab 16.
pub(crate) fn tiny_config() -> Value {
    json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 8,
        "intermediate_size": 16,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "num_hidden_layers": 1,
        "vocab_size": 16,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": false,
        "dtype": "float32"
    })
}

pub(crate) fn write_json(path: &Path, v: &Value) {
    write_raw(path, serde_json::to_string_pretty(v).unwrap().as_bytes());
}

/// Every file directly in `from` copied into `to` (created), as `cp from/* to/` would.
pub(crate) fn copy_files(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, to.join(p.file_name().unwrap())).unwrap();
    }
}

/// `n` zero bytes.
pub(crate) fn zeros(n: usize) -> Vec<u8> {
    vec![0u8; n]
}

/// A tiny valid checkpoint in a temp folder: config.json plus `model.safetensors` with an
/// embedding, one norm and an lm_head, all F32.
pub(crate) fn tiny_checkpoint() -> TempDir {
    let tmp = TempDir::new().expect("temp dir");
    write_json(&tmp.path().join("config.json"), &tiny_config());
    write_safetensors(
        &tmp.path().join("model.safetensors"),
        &[
            (
                "model.embed_tokens.weight",
                "F32",
                &[16, 8],
                &zeros(16 * 8 * 4),
            ),
            ("model.norm.weight", "F32", &[8], &zeros(8 * 4)),
            ("lm_head.weight", "F32", &[16, 8], &zeros(16 * 8 * 4)),
        ],
    );
    tmp
}

/// The tensors of a tiny Llama with `layers` layers (hidden 8, 2 heads, 1 KV head, intermediate 16,
/// vocab 16), as Hugging Face names them, in file order: name and shape.
pub(crate) fn tiny_llama_specs(layers: u64) -> Vec<(String, &'static [u64])> {
    const PER_LAYER: [(&str, &[u64]); 9] = [
        ("self_attn.q_proj.weight", &[8, 8]),
        ("self_attn.k_proj.weight", &[4, 8]),
        ("self_attn.v_proj.weight", &[4, 8]),
        ("self_attn.o_proj.weight", &[8, 8]),
        ("mlp.gate_proj.weight", &[16, 8]),
        ("mlp.up_proj.weight", &[16, 8]),
        ("mlp.down_proj.weight", &[8, 16]),
        ("input_layernorm.weight", &[8]),
        ("post_attention_layernorm.weight", &[8]),
    ];
    let mut specs: Vec<(String, &[u64])> = vec![("model.embed_tokens.weight".into(), &[16, 8])];
    for i in 0..layers {
        specs.extend(
            PER_LAYER
                .iter()
                .map(|(n, sh)| (format!("model.layers.{i}.{n}"), *sh)),
        );
    }
    specs.push(("model.norm.weight".into(), &[8]));
    specs.push(("lm_head.weight".into(), &[16, 8]));
    specs
}

/// Writes into `dir` a Llama checkpoint with `layers` layers of tiny BF16 tensors
/// ([`tiny_llama_specs`]) in one `model.safetensors`, every tensor name passed through `rename`
/// (to plant the same fault in every layer). For tests of scale.
pub(crate) fn many_layers_checkpoint(dir: &Path, layers: u64, rename: impl Fn(String) -> String) {
    let mut config = tiny_config();
    config["num_hidden_layers"] = json!(layers);
    write_json(&dir.join("config.json"), &config);
    let specs: Vec<(String, &[u64])> = tiny_llama_specs(layers)
        .into_iter()
        .map(|(n, sh)| (rename(n), sh))
        .collect();
    let data = zeros(16 * 8 * 2);
    let tensors: Vec<Tensor> = specs
        .iter()
        .map(|(n, sh)| {
            let bytes = 2 * sh.iter().product::<u64>() as usize;
            (n.as_str(), "BF16", *sh, &data[..bytes])
        })
        .collect();
    write_safetensors(&dir.join("model.safetensors"), &tensors);
}

/// A one-layer Qwen3-MoE with 2 experts, bf16, tensors named as Hugging Face saves them, with
/// `num_experts` spelled as on the Hub.
pub(crate) fn tiny_qwen3_moe() -> TempDir {
    let tmp = TempDir::new().unwrap();
    write_json(
        &tmp.path().join("config.json"),
        &json!({
            "architectures": ["Qwen3MoeForCausalLM"],
            "model_type": "qwen3_moe",
            "hidden_size": 16,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "head_dim": 8,
            "num_experts": 2,
            "num_experts_per_tok": 1,
            "moe_intermediate_size": 8,
            "intermediate_size": 16,
            "vocab_size": 64,
            "num_hidden_layers": 1,
            "rms_norm_eps": 1e-6,
            "tie_word_embeddings": false,
            "dtype": "bfloat16"
        }),
    );
    let mut specs: Vec<(String, Vec<u64>)> = vec![
        ("model.embed_tokens.weight".into(), vec![64, 16]),
        (
            "model.layers.0.self_attn.q_proj.weight".into(),
            vec![16, 16],
        ),
        (
            "model.layers.0.self_attn.k_proj.weight".into(),
            vec![16, 16],
        ),
        (
            "model.layers.0.self_attn.v_proj.weight".into(),
            vec![16, 16],
        ),
        (
            "model.layers.0.self_attn.o_proj.weight".into(),
            vec![16, 16],
        ),
        ("model.layers.0.self_attn.q_norm.weight".into(), vec![8]),
        ("model.layers.0.self_attn.k_norm.weight".into(), vec![8]),
        ("model.layers.0.mlp.gate.weight".into(), vec![2, 16]),
    ];
    for e in 0..2 {
        let p = format!("model.layers.0.mlp.experts.{e}");
        specs.push((format!("{p}.gate_proj.weight"), vec![8, 16]));
        specs.push((format!("{p}.up_proj.weight"), vec![8, 16]));
        specs.push((format!("{p}.down_proj.weight"), vec![16, 8]));
    }
    specs.extend([
        ("model.layers.0.input_layernorm.weight".into(), vec![16]),
        (
            "model.layers.0.post_attention_layernorm.weight".into(),
            vec![16],
        ),
        ("model.norm.weight".into(), vec![16]),
        ("lm_head.weight".into(), vec![64, 16]),
    ]);
    // Distinct bytes per tensor and position, so a shard that routed one expert's slice to
    // another place would differ.
    let data: Vec<Vec<u8>> = specs
        .iter()
        .enumerate()
        .map(|(t, (_, sh))| {
            (0..2 * sh.iter().product::<u64>() as usize)
                .map(|b| (b * 7 + t * 31) as u8)
                .collect()
        })
        .collect();
    let tensors: Vec<Tensor> = specs
        .iter()
        .zip(&data)
        .map(|((n, sh), d)| (n.as_str(), "BF16", sh.as_slice(), d.as_slice()))
        .collect();
    write_safetensors(&tmp.path().join("model.safetensors"), &tensors);
    tmp
}

/// config.json of a tiny DeepSeek-V4 in its release format: FP8 block linears (`quant_method
/// fp8`, E8M0 scales), MXFP4 experts (`expert_dtype fp4`); 2 layers + 1 MTP layer, hidden 64,
/// 8 heads, 4 routed experts (2 per token) and 1 shared, vocab 300.
pub(crate) fn tiny_deepseek_v4_config() -> Value {
    json!({
        "architectures": ["DeepseekV4ForCausalLM"],
        "model_type": "deepseek_v4",
        "hidden_size": 64,
        "num_attention_heads": 8,
        "head_dim": 32,
        "q_lora_rank": 32,
        "o_lora_rank": 32,
        "o_groups": 2,
        "hc_mult": 4,
        "num_hidden_layers": 2,
        "num_nextn_predict_layers": 1,
        "n_routed_experts": 4,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 64,
        "vocab_size": 300,
        "expert_dtype": "fp4",
        "dtype": "bfloat16",
        "quantization_config": {
            "quant_method": "fp8",
            "activation_scheme": "dynamic",
            "fmt": "e4m3",
            "scale_fmt": "ue8m0",
            "weight_block_size": [128, 128]
        }
    })
}

/// A tiny DeepSeek-V4 checkpoint (config above) with DeepSeek's own tensor names: per layer an
/// FP8 attention linear with its E8M0 scale, the router, one MXFP4 expert (I8 packed, E8M0
/// scales) and an FP8 shared expert; the embedding, head, norm and one MTP tensor.
pub(crate) fn tiny_deepseek_v4() -> TempDir {
    let tmp = TempDir::new().expect("temp dir");
    write_json(&tmp.path().join("config.json"), &tiny_deepseek_v4_config());
    let mut specs: Vec<(String, &str, Vec<u64>, usize)> = vec![
        ("embed.weight".into(), "BF16", vec![300, 64], 2),
        ("head.weight".into(), "BF16", vec![300, 64], 2),
        ("norm.weight".into(), "BF16", vec![64], 2),
        ("hc_head_fn".into(), "F32", vec![4, 256], 4),
        ("mtp.0.norm.weight".into(), "BF16", vec![64], 2),
    ];
    for l in 0..2 {
        let p = format!("layers.{l}");
        specs.extend([
            (format!("{p}.attn.wq_a.weight"), "F8_E4M3", vec![32, 64], 1),
            (format!("{p}.attn.wq_a.scale"), "F8_E8M0", vec![1, 1], 1),
            (format!("{p}.attn.attn_sink"), "F32", vec![8], 4),
            (format!("{p}.ffn.gate.weight"), "BF16", vec![4, 64], 2),
            (format!("{p}.ffn.gate.bias"), "F32", vec![4], 4),
            (
                format!("{p}.ffn.experts.0.w1.weight"),
                "I8",
                vec![64, 32],
                1,
            ),
            (
                format!("{p}.ffn.experts.0.w1.scale"),
                "F8_E8M0",
                vec![64, 2],
                1,
            ),
            (
                format!("{p}.ffn.shared_experts.w1.weight"),
                "F8_E4M3",
                vec![64, 64],
                1,
            ),
        ]);
    }
    let data: Vec<Vec<u8>> = (specs.iter())
        .map(|(_, _, shape, size)| zeros(shape.iter().product::<u64>() as usize * size))
        .collect();
    let tensors: Vec<Tensor> = (specs.iter().zip(&data))
        .map(|((name, dtype, shape, _), d)| (name.as_str(), *dtype, shape.as_slice(), d.as_slice()))
        .collect();
    write_safetensors(&tmp.path().join("model.safetensors"), &tensors);
    tmp
}
