//! The structure section: attention kind, experts, shared experts, dense layers, router, MTP.

use super::*;

// ---------------------------------------------------------------------------------------------
// Structure: attention kind, experts, shared experts, dense layers, router, MTP layers

/// The rows of the human report's `structure` section, up to the blank line after it.
fn structure_section(human: &str) -> String {
    let start = human
        .find("\nstructure\n")
        .unwrap_or_else(|| panic!("no structure section:\n{human}"));
    let rest = &human[start + 1..];
    rest[..rest.find("\n\n").unwrap_or(rest.len())].to_string()
}

/// `inspect` of `dir` with `--hf-overrides`, human and JSON: the structure section and object.
fn structure_with(dir: &std::path::Path, overrides: &str) -> (String, Value) {
    let out = run(&["inspect", s(dir), "--hf-overrides", overrides]);
    assert!(out.status.success(), "{}", context(&out));
    let json = wload_json(&["inspect", s(dir), "--json", "--hf-overrides", overrides]);
    (structure_section(&stdout(&out)), json["structure"].clone())
}

fn rows(lines: &[&str]) -> String {
    let mut s = String::from("structure");
    for l in lines {
        s.push_str("\n  ");
        s.push_str(l);
    }
    s
}

#[test]
fn the_structure_section_follows_the_model_section() {
    let human = inspect_human(&fixtures_dir().join("deepseek_v3"));
    let model = human.find("\nmodel\n").expect("model section");
    let structure = human.find("\nstructure\n").expect("structure section");
    let tensors = human.find("\ntensors (").expect("tensors section");
    assert!(model < structure && structure < tensors, "{human}");
}

#[test]
fn deepseek_v3_structure_names_mla_ranks_shared_experts_dense_layers_and_mtp() {
    let dir = fixtures_dir().join("deepseek_v3");
    assert_eq!(
        structure_section(&inspect_human(&dir)),
        rows(&[
            "attention            MLA: 8 heads; q_lora_rank 96, kv_lora_rank 64 (k and v are one shared latent: no kv heads to replicate)",
            "mla head dims        qk_nope 32 + qk_rope 16, v 32",
            "experts              8 routed, 2 per token, intermediate 64",
            "shared experts       1, intermediate 64; tensor-parallel even with expert parallelism",
            "layers               layer 0 dense, 1 MoE (first_k_dense_replace 1)",
            "router               sigmoid scoring, topk_method noaux_tc: F32 e_score_correction_bias [8]",
            "mtp                  1 layer past num_hidden_layers (num_nextn_predict_layers): vLLM's main model skips it",
        ])
    );
    let out = wload_json(&["inspect", s(&dir), "--json"]);
    assert_eq!(
        out["structure"],
        json!({
            "attention": {
                "kind": "mla", "heads": 8, "q_lora_rank": 96, "kv_lora_rank": 64,
                "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32
            },
            "attention_layers": null,
            "moe": {
                "routed_experts": 8, "experts_per_token": 2, "expert_intermediate_size": 64,
                "shared_experts": {
                    "count": 1, "intermediate_size": 64, "fused_intermediate_size": 64, "gate": null
                },
                "moe_layers": [1], "dense_layers": [0],
                "layer_rule": "first_k_dense_replace 1",
                "router": {
                    "scoring_func": "sigmoid", "topk_method": "noaux_tc",
                    "e_score_correction_bias": true, "bias": false
                }
            },
            "mtp_layers": 1
        })
    );
}

#[test]
fn qwen2_moe_structure_names_the_gated_shared_expert() {
    let dir = fixtures_dir().join("qwen2_moe");
    assert_eq!(
        structure_section(&inspect_human(&dir)),
        rows(&[
            "attention            GQA: 8 heads, 4 kv heads, head_dim 16",
            "experts              8 routed, 2 per token, intermediate 64",
            "shared experts       1, intermediate 128, scaled by sigmoid(shared_expert_gate); tensor-parallel even with expert parallelism",
            "layers               all 2 layers MoE",
            "router               softmax scoring",
        ])
    );
    let out = wload_json(&["inspect", s(&dir), "--json"]);
    let st = &out["structure"];
    assert_eq!(
        st["moe"]["shared_experts"],
        json!({"count": 1, "intermediate_size": 128, "fused_intermediate_size": 128, "gate": "sigmoid"})
    );
    assert_eq!(st["moe"]["moe_layers"], json!([0, 1]));
    assert_eq!(st["moe"]["dense_layers"], json!([]));
    assert_eq!(st["moe"]["layer_rule"], Value::Null);
    assert_eq!(st["mtp_layers"], 0);
}

#[test]
fn qwen3_moe_structure_names_the_mlp_only_layers() {
    let dir = fixtures_dir().join("qwen3_moe_fp8_block");
    assert_eq!(
        structure_section(&inspect_human(&dir)),
        rows(&[
            "attention            GQA: 8 heads, 4 kv heads, head_dim 16",
            "experts              8 routed, 2 per token, intermediate 64",
            "layers               layer 0 dense, 1 MoE (mlp_only_layers [0])",
            "router               softmax scoring",
        ])
    );
    let out = wload_json(&["inspect", s(&dir), "--json"]);
    let moe = &out["structure"]["moe"];
    assert_eq!(moe["routed_experts"], 8);
    assert_eq!(moe["shared_experts"], Value::Null);
    assert_eq!(moe["moe_layers"], json!([1]));
    assert_eq!(moe["dense_layers"], json!([0]));
    assert_eq!(moe["layer_rule"], "mlp_only_layers [0]");
}

#[test]
fn mixtral_and_gpt_oss_structure_has_experts_on_every_layer() {
    let mixtral = fixtures_dir().join("mixtral");
    assert_eq!(
        structure_section(&inspect_human(&mixtral)),
        rows(&[
            "attention            GQA: 8 heads, 2 kv heads, head_dim 16",
            "experts              4 routed, 2 per token, intermediate 128",
            "layers               all 2 layers MoE",
            "router               softmax scoring",
        ])
    );
    let out = wload_json(&["inspect", s(&mixtral), "--json"]);
    assert_eq!(
        out["structure"]["moe"],
        json!({
            "routed_experts": 4, "experts_per_token": 2, "expert_intermediate_size": 128,
            "shared_experts": null, "moe_layers": [0, 1], "dense_layers": [], "layer_rule": null,
            "router": {"scoring_func": "softmax", "topk_method": null, "e_score_correction_bias": false, "bias": false}
        })
    );

    let gpt_oss = fixtures_dir().join("gpt_oss");
    assert_eq!(
        structure_section(&inspect_human(&gpt_oss)),
        rows(&[
            "attention            GQA: 8 heads, 4 kv heads, head_dim 16",
            "experts              4 routed, 2 per token, intermediate 64",
            "layers               all 2 layers MoE",
            "router               softmax scoring, with a router bias",
        ])
    );
    let out = wload_json(&["inspect", s(&gpt_oss), "--json"]);
    assert_eq!(out["structure"]["moe"]["routed_experts"], 4);
    assert_eq!(out["structure"]["moe"]["router"]["bias"], true);
}

/// Qwen3.5's hybrid layers (config.layer_types: three Gated-DeltaNet layers, then gated full
/// attention), as the mapping builds them: qkv on layer 3 only.
#[test]
fn qwen3_5_structure_names_its_linear_and_full_attention_layers() {
    let dir = fixtures_dir().join("qwen3_5_moe");
    let human = structure_section(&inspect_human(&dir));
    assert!(
        human.contains(
            "  attention layers     layers 0–2 linear attention, 3 full attention (layer_types [linear_attention, linear_attention, linear_attention, full_attention], full_attention_interval 4)\n"
        ),
        "{human}"
    );
    let out = wload_json(&["inspect", s(&dir), "--json"]);
    let a = &out["structure"]["attention_layers"];
    assert_eq!(a["full"], json!([3]));
    assert_eq!(a["linear"], json!([0, 1, 2]));
    // Without layer_types, full_attention_interval decides (2: layers 1 and 3 full).
    let tmp = fixture_with("qwen3_5_moe", |c| {
        let text = c["text_config"].as_object_mut().unwrap();
        text.remove("layer_types");
        text.insert("full_attention_interval".into(), json!(2));
    });
    let out = wload_json(&["inspect", s(tmp.path()), "--json"]);
    let a = &out["structure"]["attention_layers"];
    assert_eq!((&a["full"], &a["linear"]), (&json!([1, 3]), &json!([0, 2])));
}

#[test]
fn llama_gqa_structure_is_grouped_query_attention_without_experts() {
    let dir = fixtures_dir().join("llama_gqa");
    assert_eq!(
        structure_section(&inspect_human(&dir)),
        rows(&[
            "attention            GQA: 8 heads, 4 kv heads, head_dim 16",
            "experts              none (a dense MLP on every layer)",
        ])
    );
    let out = wload_json(&["inspect", s(&dir), "--json"]);
    assert_eq!(
        out["structure"],
        json!({
            "attention": {"kind": "gqa", "heads": 8, "kv_heads": 4, "head_dim": 16},
            "attention_layers": null,
            "moe": null,
            "mtp_layers": 0
        })
    );
    let (mqa, _) = structure_with(&dir, r#"{"num_key_value_heads": 1}"#);
    assert!(
        mqa.contains("MQA: 8 heads, 1 kv head, head_dim 16"),
        "{mqa}"
    );
    let (_, mha) = structure_with(&dir, r#"{"num_key_value_heads": 8}"#);
    assert_eq!(mha["attention"]["kind"], "mha");
}

#[test]
fn deepseek_defaults_apply_when_the_config_leaves_fields_out() {
    // DeepseekV3Config's first_k_dense_replace is 3 when config.json leaves it out; an explicit
    // null q_lora_rank means no q compression (V2-Lite); two shared experts are fused into one MLP.
    let tmp = fixture_with("deepseek_v3", |m| {
        m.remove("first_k_dense_replace").expect("stated");
    });
    let dir = tmp.path();
    let (human, st) = structure_with(
        dir,
        r#"{"num_hidden_layers": 61, "q_lora_rank": null, "n_shared_experts": 2,
            "num_nextn_predict_layers": 3}"#,
    );
    assert!(
        human.contains("q_lora_rank none (q_proj from the hidden state)"),
        "{human}"
    );
    assert!(
        human.contains("layers 0–2 dense, 3–60 MoE (first_k_dense_replace 3)"),
        "{human}"
    );
    assert!(
        human.contains("2 × 64, fused into one MLP of 128"),
        "{human}"
    );
    assert!(human.contains("3 layers past num_hidden_layers"), "{human}");
    assert_eq!(st["attention"]["q_lora_rank"], Value::Null);
    assert_eq!(st["moe"]["dense_layers"], json!([0, 1, 2]));
    assert_eq!(st["moe"]["moe_layers"].as_array().unwrap().len(), 58);
    assert_eq!(st["moe"]["shared_experts"]["fused_intermediate_size"], 128);

    // moe_layer_freq 2: every other layer from first_k_dense_replace on.
    let dir = fixtures_dir().join("deepseek_v3");
    let dir = dir.as_path();
    let (human, st) = structure_with(
        dir,
        r#"{"num_hidden_layers": 12, "first_k_dense_replace": 1, "moe_layer_freq": 2}"#,
    );
    assert_eq!(st["moe"]["moe_layers"], json!([2, 4, 6, 8, 10]));
    assert!(
        human.contains("5 MoE (2, 4, 6, …), 7 dense (first_k_dense_replace 1, moe_layer_freq 2)"),
        "{human}"
    );

    // n_routed_experts 0: vLLM builds a dense MLP everywhere.
    let (human, st) = structure_with(dir, r#"{"n_routed_experts": 0}"#);
    assert_eq!(st["moe"], Value::Null);
    assert!(
        human.contains("none (a dense MLP on every layer)"),
        "{human}"
    );

    // Without topk_method (DeepseekV3Config has none) there is no correction bias.
    let (human, st) = structure_with(dir, r#"{"topk_method": null}"#);
    assert_eq!(st["moe"]["router"]["e_score_correction_bias"], false);
    assert!(
        human.contains("router               sigmoid scoring\n"),
        "{human}\n"
    );
}

#[test]
fn qwen_sparse_step_and_no_shared_expert_are_described() {
    let (human, st) = structure_with(
        &fixtures_dir().join("qwen2_moe"),
        r#"{"num_hidden_layers": 48, "decoder_sparse_step": 2, "shared_expert_intermediate_size": 0}"#,
    );
    assert!(
        human
            .contains("layers               24 MoE (1, 3, 5, …), 24 dense (decoder_sparse_step 2)"),
        "{human}"
    );
    assert!(!human.contains("shared experts"), "{human}");
    assert_eq!(st["moe"]["shared_experts"], Value::Null);
    assert_eq!(st["moe"]["moe_layers"][0], 1);
    assert_eq!(st["moe"]["dense_layers"][0], 0);
}

#[test]
fn odd_structure_fields_are_unknown_and_inspect_still_succeeds() {
    let dir = fixtures_dir().join("deepseek_v3");
    let (human, st) = structure_with(
        &dir,
        r#"{"first_k_dense_replace": "three", "kv_lora_rank": "x", "q_lora_rank": [1],
            "moe_intermediate_size": null, "num_nextn_predict_layers": -1, "topk_method": 5}"#,
    );
    assert_eq!(
        human,
        rows(&[
            "attention            MLA: 8 heads; q_lora_rank unknown, kv_lora_rank unknown (k and v are one shared latent: no kv heads to replicate)",
            "mla head dims        qk_nope 32 + qk_rope 16, v 32",
            // An explicit null is not the class default (2048): transformers keeps None, which
            // its `int` field then refuses.
            "experts              8 routed, 2 per token, intermediate unknown",
            "shared experts       1, intermediate unknown; tensor-parallel even with expert parallelism",
            r#"layers               unknown (first_k_dense_replace = "three")"#,
            "router               sigmoid scoring",
            "mtp                  unknown",
        ])
    );
    assert_eq!(st["attention"]["q_lora_rank"], "unknown");
    assert_eq!(st["attention"]["kv_lora_rank"], Value::Null);
    assert_eq!(st["moe"]["moe_layers"], Value::Null);
    assert_eq!(st["moe"]["dense_layers"], Value::Null);
    assert_eq!(st["mtp_layers"], Value::Null);

    let (human, _) = structure_with(
        &fixtures_dir().join("qwen3_moe_fp8_block"),
        r#"{"mlp_only_layers": [0, "x"]}"#,
    );
    assert!(
        human.contains(r#"layers               unknown (mlp_only_layers = [0,"x"])"#),
        "{human}"
    );
    let (human, _) = structure_with(
        &fixtures_dir().join("qwen2_moe"),
        r#"{"decoder_sparse_step": 0}"#,
    );
    assert!(
        human.contains("layers               unknown (decoder_sparse_step 0)"),
        "{human}"
    );
}

#[test]
fn an_absurd_layer_count_is_not_listed() {
    let started = std::time::Instant::now();
    let (human, st) = structure_with(
        &fixtures_dir().join("deepseek_v3"),
        r#"{"num_hidden_layers": 1000000000000}"#,
    );
    assert!(human.contains("layers               unknown\n"), "{human}");
    assert_eq!(st["moe"]["moe_layers"], Value::Null);
    assert!(started.elapsed().as_secs() < 30, "{:?}", started.elapsed());

    // The most layers listed: a per-layer linear search took 28 s here (debug build).
    let started = std::time::Instant::now();
    let (human, st) = structure_with(
        &fixtures_dir().join("deepseek_v3"),
        r#"{"num_hidden_layers": 65536, "first_k_dense_replace": 3}"#,
    );
    assert!(
        human.contains("layers 0–2 dense, 3–65535 MoE (first_k_dense_replace 3)"),
        "{human}"
    );
    assert_eq!(st["moe"]["moe_layers"].as_array().unwrap().len(), 65533);
    assert!(started.elapsed().as_secs() < 10, "{:?}", started.elapsed());
}

#[test]
fn the_json_schema_doc_names_every_structure_field() {
    let doc = fs::read_to_string(manifest_dir().join("docs/inspect-json.md")).unwrap();
    let mut keys: Vec<String> = vec!["structure".into()];
    for fixture in ["deepseek_v3", "qwen2_moe", "llama_gqa", "qwen3_5_moe"] {
        let out = wload_json(&["inspect", s(&fixtures_dir().join(fixture)), "--json"]);
        let st = &out["structure"];
        let mut objs = vec![st, &st["attention"]];
        if st["attention_layers"].is_object() {
            objs.push(&st["attention_layers"]);
        }
        if st["moe"].is_object() {
            objs.extend([&st["moe"], &st["moe"]["router"]]);
            if st["moe"]["shared_experts"].is_object() {
                objs.push(&st["moe"]["shared_experts"]);
            }
        }
        for o in objs {
            keys.extend(o.as_object().unwrap().keys().cloned());
        }
    }
    for k in keys {
        assert!(
            doc.contains(&format!("\"{k}\"")),
            "docs/inspect-json.md does not name {k:?}"
        );
    }
}

#[test]
fn glm4_moe_defaults_give_one_dense_layer_a_shared_expert_and_one_mtp_layer() {
    // No GLM fixture: the Qwen3-MoE one read as Glm4MoeForCausalLM, with the fields Glm4MoeConfig
    // defaults (first_k_dense_replace 1, n_shared_experts 1, one MTP layer) left out.
    let (human, st) = structure_with(
        &fixtures_dir().join("qwen3_moe_fp8_block"),
        r#"{"architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe",
            "num_experts": null, "num_local_experts": null, "n_routed_experts": 16,
            "num_hidden_layers": 4, "mlp_only_layers": null}"#,
    );
    assert_eq!(
        human,
        rows(&[
            "attention            GQA: 8 heads, 4 kv heads, head_dim 16",
            "experts              16 routed, 2 per token, intermediate 64",
            "shared experts       1, intermediate 64; tensor-parallel even with expert parallelism",
            "layers               layer 0 dense, 1–3 MoE (first_k_dense_replace 1)",
            "router               sigmoid scoring: F32 e_score_correction_bias [16]",
            "mtp                  1 layer past num_hidden_layers (num_nextn_predict_layers): vLLM's main model skips it",
        ])
    );
    assert_eq!(st["mtp_layers"], 1);
    assert_eq!(st["moe"]["router"]["e_score_correction_bias"], true);
}

/// A family only a mapping file knows: its structure comes from the file (which layers build
/// experts, their count and width, shared experts, the router's bias, the layers `skip_layer`
/// skips, the scoring its defaults name), with no Rust for it.
const CUSTOM_MOE_MAPPING: &str = r#"
family: custom_moe
description: a made-up MoE family known only to this file
architectures: [CustomMoeForCausalLM]
defaults:
  dense_head_layers: 1
  n_shared_experts: 2
  scoring_func: sigmoid
  mtp_depth: 2
derive:
  shared_size: moe_intermediate_size * n_shared_experts
  moe_layer: "i >= dense_head_layers && i % 2 == 1"
skip_layer: i >= num_hidden_layers && i < num_hidden_layers + mtp_depth
parameters:
  layer:
    - name: model.layers.{i}.mlp.router.bias
      when: moe_layer
      layout: {kind: replicated, shape: [num_experts]}
    - name: model.layers.{i}.mlp.shared_experts.gate_up_proj.weight
      when: moe_layer
      layout: {kind: merged_column, sizes: [shared_size, shared_size], inner: [hidden_size]}
    - name: model.layers.{i}.mlp.experts.w13_weight
      when: moe_layer
      layout: {kind: experts, part: w13, experts: num_experts * 2, intermediate: moe_intermediate_size, hidden: hidden_size}
"#;

#[test]
fn a_family_only_its_mapping_file_knows_gets_its_structure_from_the_file() {
    let work = TempDir::new().unwrap();
    let file = work.path().join("custom_moe.yaml");
    fs::write(&file, CUSTOM_MOE_MAPPING).unwrap();
    let dir = fixtures_dir().join("qwen3_moe_fp8_block");
    let overrides = r#"{"architectures": ["CustomMoeForCausalLM"], "num_hidden_layers": 6,
                        "mlp_only_layers": null, "dense_head_layers": 3}"#;
    let args = |json: bool| {
        let mut a = vec![
            "inspect",
            s(&dir),
            "--hf-overrides",
            overrides,
            "--mapping",
            s(&file),
        ];
        if json {
            a.push("--json");
        }
        a
    };
    let out = run(&args(false));
    assert!(out.status.success(), "{}", context(&out));
    assert_eq!(
        structure_section(&stdout(&out)),
        rows(&[
            "attention            GQA: 8 heads, 4 kv heads, head_dim 16",
            "experts              16 routed, 2 per token, intermediate 64",
            "shared experts       2 × 64, fused into one MLP of 128; tensor-parallel even with expert parallelism",
            "layers               layers 0–2 dense, 3 MoE, 4 dense, 5 MoE (dense_head_layers 3)",
            "router               sigmoid scoring, with a router bias",
            "mtp                  2 layers past num_hidden_layers (mtp_depth): vLLM's main model skips them",
        ])
    );
    let st = wload_json(&args(true))["structure"].clone();
    assert_eq!(st["moe"]["moe_layers"], json!([3, 5]));
    assert_eq!(st["moe"]["dense_layers"], json!([0, 1, 2, 4]));
    assert_eq!(st["moe"]["layer_rule"], "dense_head_layers 3");
    assert_eq!(st["moe"]["shared_experts"]["count"], 2);
    assert_eq!(st["mtp_layers"], 2);

    // Without the file wload has no mapping for the architecture: the config's experts only,
    // under a title that says so, and exit 3 (support.rs has the rest of that refusal).
    let out = run(&["inspect", s(&dir), "--hf-overrides", overrides]);
    assert_eq!(out.status.code(), Some(3), "{}", context(&out));
    let human = stdout(&out);
    assert!(
        human.contains("\nstructure (read from config.json only: "),
        "{human}"
    );
    assert!(human.contains("layers               unknown"), "{human}");
    let v = json_doc(
        &["inspect"],
        &run(&["inspect", s(&dir), "--json", "--hf-overrides", overrides]),
    );
    let st = v["structure"].clone();
    assert_eq!(st["moe"]["routed_experts"], 8);
    assert_eq!(st["moe"]["moe_layers"], Value::Null);

    // A mapping file that is not there is refused, as by plan.
    let missing = work.path().join("missing.yaml");
    let out = run(&["inspect", s(&dir), "--mapping", s(&missing)]);
    assert_refusal_text(&out, 2, &["missing.yaml", "cannot read"]);
}
