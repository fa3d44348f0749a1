//! A GPTQ output must reload: vLLM derives the quantized layers from the loaded folder, whose
//! rank files carry the fused names, so wload writes `modules_in_block_to_quantize` into the
//! output's config.json (the form real vLLM was verified to load identically) and says so; the
//! source folder's config.json is untouched, and a config that lists them is copied as it is.

use super::*;

fn config(dir: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap()
}

#[test]
fn a_gptq_output_lists_its_quantized_modules_per_block() {
    let src = dense(Method::Gptq, 32, json!({}));
    let before = std::fs::read(src.path().join("config.json")).unwrap();
    let out = sharded(src.path(), 2, &[]);
    let dir = out.path().join("out");
    let listed = &config(&dir)["quantization_config"]["modules_in_block_to_quantize"];
    assert_eq!(
        listed,
        &json!([
            ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
            ["self_attn.o_proj"],
            ["mlp.gate_proj", "mlp.up_proj"],
            ["mlp.down_proj"]
        ])
    );
    assert_eq!(
        std::fs::read(src.path().join("config.json")).unwrap(),
        before
    );
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(dir.join("wload.json")).unwrap()).unwrap();
    let changes = manifest["config_changes"].to_string();
    assert!(
        changes.contains("modules_in_block_to_quantize"),
        "{changes}"
    );
}

#[test]
fn a_listed_gptq_config_and_an_awq_config_are_copied_unchanged() {
    let listed = json!({"modules_in_block_to_quantize": [["self_attn.q_proj", "self_attn.k_proj",
        "self_attn.v_proj"], ["self_attn.o_proj"], ["mlp.gate_proj", "mlp.up_proj"], ["mlp.down_proj"]]});
    for src in [
        dense(Method::Gptq, 32, listed),
        dense(Method::Awq, 32, json!({})),
    ] {
        let out = sharded(src.path(), 2, &[]);
        let copied = std::fs::read(out.path().join("out/config.json")).unwrap();
        assert_eq!(
            copied,
            std::fs::read(src.path().join("config.json")).unwrap()
        );
    }
}

/// Qwen3-MoE: only the attention groups (the experts are quantized whatever the list says).
#[test]
fn a_gptq_moe_output_lists_its_attention_groups() {
    let src = super::moe::qwen3_moe_gptq();
    let out = sharded(src.path(), 2, &[]);
    let listed = &config(&out.path().join("out"))["quantization_config"];
    assert_eq!(
        listed["modules_in_block_to_quantize"],
        json!([
            ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
            ["self_attn.o_proj"]
        ])
    );
}
