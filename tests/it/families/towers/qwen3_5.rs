//! Qwen3.5's ViT (`Qwen3_5ForConditionalGeneration`, `visual.*`: Qwen3-VL's vision transformer,
//! no deepstack mergers) on a generated dense checkpoint (vision hidden 16, 2 heads, MLP 32, 2
//! blocks, merge 2: merger width 64; a two-layer GDN + gated-attention text model): the fused
//! on-disk `attn.qkv` cut into `[q_r; k_r; v_r]`, `attn.proj`, `linear_fc2` by columns with
//! their biases whole, `linear_fc1` by rows; whole on every rank with `--mm-encoder-tp-mode
//! data` (spec §13.1, `qwen3_5__mmdata`); 2 vision heads at TP 4 refused in vLLM's words.

use serde_json::json;
use tempfile::TempDir;

use super::{Cut, Rule, assert_tower_then_text, rule};
use crate::support::*;

const DATA: [&str; 2] = ["--mm-encoder-tp-mode", "data"];

/// The ViT's tensors as the checkpoint stores them (`model.visual.` + this), in file order.
const TOWER: [(&str, &[usize]); 9] = [
    ("patch_embed.proj.weight", &[16, 3, 2, 4, 4]),
    ("patch_embed.proj.bias", &[16]),
    ("pos_embed.weight", &[16, 16]),
    ("merger.norm.weight", &[16]),
    ("merger.norm.bias", &[16]),
    ("merger.linear_fc1.weight", &[64, 64]),
    ("merger.linear_fc1.bias", &[64]),
    ("merger.linear_fc2.weight", &[32, 64]),
    ("merger.linear_fc2.bias", &[32]),
];

/// One ViT block's tensors (`model.visual.blocks.{j}.` + this).
const BLOCK: [(&str, &[usize]); 12] = [
    ("norm1.weight", &[16]),
    ("norm1.bias", &[16]),
    ("norm2.weight", &[16]),
    ("norm2.bias", &[16]),
    ("attn.qkv.weight", &[48, 16]),
    ("attn.qkv.bias", &[48]),
    ("attn.proj.weight", &[16, 16]),
    ("attn.proj.bias", &[16]),
    ("mlp.linear_fc1.weight", &[32, 16]),
    ("mlp.linear_fc1.bias", &[32]),
    ("mlp.linear_fc2.weight", &[16, 32]),
    ("mlp.linear_fc2.bias", &[16]),
];

/// The text model (`model.language_model.` + this): hidden 32; layer 0 Gated-DeltaNet (2 key
/// heads, 4 value heads of 8), layer 1 gated attention (4 heads, 2 kv heads of 8); MLP 32.
const TEXT: [(&str, &[usize]); 27] = [
    ("embed_tokens.weight", &[16, 32]),
    ("layers.0.input_layernorm.weight", &[32]),
    ("layers.0.linear_attn.A_log", &[4]),
    ("layers.0.linear_attn.conv1d.weight", &[64, 1, 4]),
    ("layers.0.linear_attn.dt_bias", &[4]),
    ("layers.0.linear_attn.in_proj_a.weight", &[4, 32]),
    ("layers.0.linear_attn.in_proj_b.weight", &[4, 32]),
    ("layers.0.linear_attn.in_proj_qkv.weight", &[64, 32]),
    ("layers.0.linear_attn.in_proj_z.weight", &[32, 32]),
    ("layers.0.linear_attn.norm.weight", &[8]),
    ("layers.0.linear_attn.out_proj.weight", &[32, 32]),
    ("layers.0.mlp.down_proj.weight", &[32, 32]),
    ("layers.0.mlp.gate_proj.weight", &[32, 32]),
    ("layers.0.mlp.up_proj.weight", &[32, 32]),
    ("layers.0.post_attention_layernorm.weight", &[32]),
    ("layers.1.input_layernorm.weight", &[32]),
    ("layers.1.mlp.down_proj.weight", &[32, 32]),
    ("layers.1.mlp.gate_proj.weight", &[32, 32]),
    ("layers.1.mlp.up_proj.weight", &[32, 32]),
    ("layers.1.post_attention_layernorm.weight", &[32]),
    ("layers.1.self_attn.k_norm.weight", &[8]),
    ("layers.1.self_attn.k_proj.weight", &[16, 32]),
    ("layers.1.self_attn.o_proj.weight", &[32, 32]),
    ("layers.1.self_attn.q_norm.weight", &[8]),
    ("layers.1.self_attn.q_proj.weight", &[64, 32]),
    ("layers.1.self_attn.v_proj.weight", &[16, 32]),
    ("norm.weight", &[32]),
];

/// A Qwen3_5ForConditionalGeneration checkpoint as transformers 5 writes it.
fn checkpoint() -> TempDir {
    let config = json!({
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": {
            "model_type": "qwen3_5_text", "hidden_size": 32, "intermediate_size": 32,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 8, "vocab_size": 16, "linear_conv_kernel_dim": 4,
            "linear_key_head_dim": 8, "linear_value_head_dim": 8, "linear_num_key_heads": 2,
            "linear_num_value_heads": 4, "layer_types": ["linear_attention", "full_attention"],
            "tie_word_embeddings": false
        },
        "vision_config": {
            "model_type": "qwen3_5_vision", "depth": 2, "hidden_size": 16, "intermediate_size": 32,
            "num_heads": 2, "in_channels": 3, "patch_size": 4, "temporal_patch_size": 2,
            "spatial_merge_size": 2, "out_hidden_size": 32, "num_position_embeddings": 16
        },
        "tie_word_embeddings": false,
        "dtype": "bfloat16"
    });
    let mut specs: Vec<(String, &[usize])> = Vec::new();
    specs.extend(
        TOWER
            .iter()
            .map(|(n, sh)| (format!("model.visual.{n}"), *sh)),
    );
    for j in 0..2 {
        specs.extend(
            BLOCK
                .iter()
                .map(|(n, sh)| (format!("model.visual.blocks.{j}.{n}"), *sh)),
        );
    }
    specs.extend(
        TEXT.iter()
            .map(|(n, sh)| (format!("model.language_model.{n}"), *sh)),
    );
    specs.push(("lm_head.weight".into(), &[16, 32]));
    let tensors: Tensors = (specs.into_iter().enumerate())
        .map(|(k, (n, sh))| {
            let data = bf16_data(k as u64 + 1000, sh.iter().product());
            (n, Held::new("BF16", sh, data))
        })
        .collect();
    write_checkpoint(&config, &tensors)
}

/// Qwen3_VisionTransformer in registration order: patch_embed, pos_embed, merger, blocks.
fn rules() -> Vec<Rule> {
    let m = |n: &str| vec![format!("model.visual.{n}")];
    let v = |n: &str| format!("visual.{n}");
    let mut t: Vec<Rule> = [
        ("patch_embed.proj.weight", Cut::Whole),
        ("patch_embed.proj.bias", Cut::Whole),
        ("pos_embed.weight", Cut::Whole),
        ("merger.norm.weight", Cut::Whole),
        ("merger.norm.bias", Cut::Whole),
        ("merger.linear_fc1.weight", Cut::Rows),
        ("merger.linear_fc1.bias", Cut::Rows),
        ("merger.linear_fc2.weight", Cut::Cols),
        ("merger.linear_fc2.bias", Cut::Whole),
    ]
    .into_iter()
    .map(|(n, c)| rule(v(n), c, &m(n)))
    .collect();
    for j in 0..2 {
        for (n, c) in [
            ("norm1.weight", Cut::Whole),
            ("norm1.bias", Cut::Whole),
            ("norm2.weight", Cut::Whole),
            ("norm2.bias", Cut::Whole),
            ("attn.qkv.weight", Cut::Qkv),
            ("attn.qkv.bias", Cut::Qkv),
            ("attn.proj.weight", Cut::Cols),
            ("attn.proj.bias", Cut::Whole),
            ("mlp.linear_fc1.weight", Cut::Rows),
            ("mlp.linear_fc1.bias", Cut::Rows),
            ("mlp.linear_fc2.weight", Cut::Cols),
            ("mlp.linear_fc2.bias", Cut::Whole),
        ] {
            let n = format!("blocks.{j}.{n}");
            t.push(rule(v(&n), c, &m(&n)));
        }
    }
    t
}

/// TP 2 split; data mode at TP 2 and at TP 4 (more ranks than vision heads: accepted, the
/// tower being whole) holds the checkpoint's tensors on every rank.
#[test]
fn the_vit_splits_over_tp_and_is_whole_in_data_mode() {
    let (src, tmp) = (checkpoint(), TempDir::new().unwrap());
    for (tp, data) in [(2u64, false), (2, true), (4, true)] {
        assert_tower_then_text(src.path(), tmp.path(), &rules(), (tp, data));
    }
}

/// 2 vision heads at TP 4: refused in vLLM's words with the sizes that work and both flags;
/// `sizes` agrees in each mode.
#[test]
fn vision_heads_tp_does_not_divide_are_refused_unless_the_tower_is_whole() {
    let src = checkpoint();
    let refused = run(&["plan", s(src.path()), "--tp", "4"]);
    assert_refusal_text(
        &refused,
        3,
        &[
            "AssertionError: 2 is not divisible by 4",
            "pass --mm-encoder-tp-mode data",
            "--language-model-only",
            "TP sizes that work: 1, 2",
        ],
    );
    let weights = wload_json(&["sizes", s(src.path()), "--max-tp", "4", "--json"]);
    assert_eq!(weights["accepted_tp"], json!([1, 2]));
    let args = [
        &["sizes", s(src.path()), "--max-tp", "4", "--json"][..],
        &DATA,
    ]
    .concat();
    assert_eq!(wload_json(&args)["accepted_tp"], json!([1, 2, 4]));
}
