//! Mapping files as a user meets them: every file in `mappings/` is shipped, a family that differs
//! from Llama by two norms is a few lines of YAML passed with `--mapping`, derived values may
//! depend on the layer, and mistakes in a mapping's edits are refused as the file's fault (exit 2).

use std::fs;
use std::path::Path;

use serde_json::{Value, json};
use tempfile::TempDir;

use crate::support::*;

const HIDDEN: u64 = 8;
const HEAD_DIM: u64 = 4;

/// A Llama-shaped checkpoint (hidden 8, 2 heads of 4, 1 kv head, vocab 16, F32) with `layers`
/// layers; `extra(i)` adds tensors to layer `i`, `mlp(i)` says whether it has the dense MLP.
fn checkpoint(
    config: Value,
    layers: u64,
    mlp: impl Fn(u64) -> bool,
    extra: impl Fn(u64) -> Vec<(String, Vec<u64>)>,
) -> TempDir {
    let tmp = TempDir::new().unwrap();
    let mut cfg = tiny_config();
    cfg["num_hidden_layers"] = json!(layers);
    for (k, v) in config.as_object().unwrap() {
        cfg[k] = v.clone();
    }
    write_json(&tmp.path().join("config.json"), &cfg);
    let mut specs: Vec<(String, Vec<u64>)> =
        vec![("model.embed_tokens.weight".into(), vec![16, 8])];
    for i in 0..layers {
        let p = format!("model.layers.{i}");
        specs.extend([
            (format!("{p}.self_attn.q_proj.weight"), vec![8, 8]),
            (format!("{p}.self_attn.k_proj.weight"), vec![4, 8]),
            (format!("{p}.self_attn.v_proj.weight"), vec![4, 8]),
            (format!("{p}.self_attn.o_proj.weight"), vec![8, 8]),
            (format!("{p}.input_layernorm.weight"), vec![HIDDEN]),
            (format!("{p}.post_attention_layernorm.weight"), vec![HIDDEN]),
        ]);
        if mlp(i) {
            specs.extend([
                (format!("{p}.mlp.gate_proj.weight"), vec![16, 8]),
                (format!("{p}.mlp.up_proj.weight"), vec![16, 8]),
                (format!("{p}.mlp.down_proj.weight"), vec![8, 16]),
            ]);
        }
        specs.extend(extra(i));
    }
    specs.extend([
        ("model.norm.weight".into(), vec![HIDDEN]),
        ("lm_head.weight".into(), vec![16, 8]),
    ]);
    let data: Vec<Vec<u8>> = specs
        .iter()
        .map(|(_, sh)| zeros(4 * sh.iter().product::<u64>() as usize))
        .collect();
    let tensors: Vec<Tensor> = specs
        .iter()
        .zip(&data)
        .map(|((n, sh), d)| (n.as_str(), "F32", sh.as_slice(), d.as_slice()))
        .collect();
    write_safetensors(&tmp.path().join("model.safetensors"), &tensors);
    tmp
}

fn qk_norms(i: u64) -> Vec<(String, Vec<u64>)> {
    ["q_norm", "k_norm"]
        .iter()
        .map(|n| {
            (
                format!("model.layers.{i}.self_attn.{n}.weight"),
                vec![HEAD_DIM],
            )
        })
        .collect()
}

/// Qwen2 with `qk_norm` (BAGEL-style configs; qwen2.py:263): q_norm and k_norm, registered
/// after o_proj and before the attention's buffers. Without the flag they are not parameters.
#[test]
fn qwen2_builds_q_and_k_norms_when_the_config_asks() {
    let with_biases = |i: u64| {
        let mut t = qk_norms(i);
        t.extend(
            ["q_proj", "k_proj", "v_proj"]
                .iter()
                .zip([8, 4, 4])
                .map(|(n, rows)| (format!("model.layers.{i}.self_attn.{n}.bias"), vec![rows])),
        );
        t
    };
    let config =
        json!({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "qk_norm": true});
    let ckpt = checkpoint(config, 1, |_| true, with_biases);
    let plan = wload_json(&["plan", s(ckpt.path()), "--tp", "2", "--json"]);
    assert_eq!(
        layer_names(&plan, 0)[..6],
        [
            "self_attn.qkv_proj.weight",
            "self_attn.qkv_proj.bias",
            "self_attn.o_proj.weight",
            "self_attn.q_norm.weight",
            "self_attn.k_norm.weight",
            "self_attn.attn._k_scale",
        ]
    );
    let config = json!({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"});
    let ckpt = checkpoint(config, 1, |_| true, with_biases);
    let out = run(&["plan", s(ckpt.path()), "--tp", "2"]);
    assert_refusal_text(
        &out,
        3,
        &["tensor 'model.layers.0.self_attn.q_norm.weight' matches no parameter"],
    );
}

/// Rank 0's tensor names, in the order vLLM's state_dict has them.
fn rank0_names(plan: &Value) -> Vec<String> {
    plan["ranks"][0]["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect()
}

fn layer_names(plan: &Value, i: u64) -> Vec<String> {
    let prefix = format!("model.layers.{i}.");
    rank0_names(plan)
        .into_iter()
        .filter_map(|n| n.strip_prefix(&prefix).map(str::to_string))
        .collect()
}

/// The worked example of docs/mapping-format.md, word for word.
const TWO_NORMS: &str = "\
extends: llama
family: acme
architectures: [AcmeForCausalLM]
parameters:
  layer:
    - {use: qk_norms, after: attention_scales}
";

#[test]
fn every_file_in_mappings_is_embedded() {
    let mut on_disk: Vec<String> = fs::read_dir(manifest_dir().join("mappings"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".yaml") && n != "common.yaml")
        .collect();
    on_disk.sort();
    let embedded: Vec<&str> = wload::testing::EMBEDDED.iter().map(|(n, _)| *n).collect();
    assert_eq!(on_disk, embedded);
    for (name, text) in wload::testing::EMBEDDED {
        let disk = fs::read_to_string(manifest_dir().join("mappings").join(name)).unwrap();
        assert_eq!(&disk, text, "{name} is embedded as it is on disk");
    }
}

#[test]
fn a_family_with_two_more_norms_is_a_few_lines_of_yaml() {
    assert!(TWO_NORMS.lines().count() <= 6);
    let dir = TempDir::new().unwrap();
    let file = dir.path().join("acme.yaml");
    fs::write(&file, TWO_NORMS).unwrap();
    let ckpt = checkpoint(
        json!({"architectures": ["AcmeForCausalLM"]}),
        2,
        |_| true,
        qk_norms,
    );
    let plan = wload_json(&[
        "plan",
        s(ckpt.path()),
        "--tp",
        "2",
        "--mapping",
        s(&file),
        "--json",
    ]);
    assert_eq!(plan["family"], "acme");
    // vLLM's Qwen3 registration order: the norms after the attention's buffers, before the MLP.
    let expected = [
        "self_attn.qkv_proj.weight",
        "self_attn.o_proj.weight",
        "self_attn.attn._k_scale",
        "self_attn.attn._v_scale",
        "self_attn.attn._q_scale",
        "self_attn.attn._prob_scale",
        "self_attn.q_norm.weight",
        "self_attn.k_norm.weight",
        "mlp.gate_up_proj.weight",
        "mlp.down_proj.weight",
        "input_layernorm.weight",
        "post_attention_layernorm.weight",
    ];
    for i in 0..2 {
        assert_eq!(layer_names(&plan, i), expected, "layer {i}");
    }
    // The shipped Qwen3 file says the same thing (given the head_dim it would otherwise take
    // as 128, Qwen3Config's default).
    let qwen3 = checkpoint(
        json!({"architectures": ["Qwen3ForCausalLM"], "tie_word_embeddings": false, "head_dim": 4}),
        2,
        |_| true,
        qk_norms,
    );
    let shipped = wload_json(&["plan", s(qwen3.path()), "--tp", "2", "--json"]);
    assert_eq!(shipped["family"], "qwen3");
    assert_eq!(rank0_names(&shipped), rank0_names(&plan));
}

/// Without the new file, Llama's mapping has no place for the norms: the file is what matters.
#[test]
fn the_same_checkpoint_without_the_file_is_refused() {
    let ckpt = checkpoint(json!({}), 1, |_| true, qk_norms);
    let out = wload()
        .args(["plan", s(ckpt.path()), "--tp", "1"])
        .output()
        .unwrap();
    assert_refusal_text(&out, 3, &["model.layers.0.self_attn.q_norm.weight"]);
}

/// The shipped Qwen3-MoE file picks MoE or dense per layer with a derived value that reads `i`.
#[test]
fn qwen3_moe_chooses_moe_or_dense_per_layer() {
    let experts = |i: u64| -> Vec<(String, Vec<u64>)> {
        let mut t = qk_norms(i);
        if i != 1 {
            let p = format!("model.layers.{i}.mlp");
            t.push((format!("{p}.gate.weight"), vec![2, 8]));
            for e in 0..2 {
                t.push((format!("{p}.experts.{e}.gate_proj.weight"), vec![4, 8]));
                t.push((format!("{p}.experts.{e}.up_proj.weight"), vec![4, 8]));
                t.push((format!("{p}.experts.{e}.down_proj.weight"), vec![8, 4]));
            }
        }
        t
    };
    let cfg = json!({
        "architectures": ["Qwen3MoeForCausalLM"], "num_experts": 2, "moe_intermediate_size": 4,
        "mlp_only_layers": [1], "head_dim": 4
    });
    let ckpt = checkpoint(cfg, 3, |i| i == 1, experts);
    let plan = wload_json(&["plan", s(ckpt.path()), "--tp", "2", "--json"]);
    let moe = [
        "mlp.experts.gate.weight",
        "mlp.experts.routed_experts.w13_weight",
        "mlp.experts.routed_experts.w2_weight",
    ];
    let dense = ["mlp.gate_up_proj.weight", "mlp.down_proj.weight"];
    for i in 0..3 {
        let names = layer_names(&plan, i);
        let mlp: Vec<&str> = names
            .iter()
            .map(String::as_str)
            .filter(|n| n.starts_with("mlp."))
            .collect();
        let want: &[&str] = if i == 1 { &dense } else { &moe };
        assert_eq!(mlp, want, "layer {i}");
    }
}

/// A derived value that reads the layer index, in a user's file: a norm only on the layers a
/// config list names, with a width that depends on the layer.
#[test]
fn a_users_derived_value_may_read_the_layer() {
    let dir = TempDir::new().unwrap();
    let file = dir.path().join("gated.yaml");
    fs::write(
        &file,
        "extends: llama\nfamily: gated\narchitectures: [LlamaForCausalLM]\n\
         derive:\n  gated: \"i in gated_layers\"\n  gate_width: \"hidden_size * (i + 1)\"\n\
         parameters:\n  layer:\n    - {name: \"model.layers.{i}.gate_norm.weight\", when: gated, \
         layout: {kind: replicated, shape: [gate_width]}}\n",
    )
    .unwrap();
    let norm = |i: u64| {
        vec![(
            format!("model.layers.{i}.gate_norm.weight"),
            vec![HIDDEN * (i + 1)],
        )]
    };
    let ckpt = checkpoint(
        json!({"gated_layers": [1, 2]}),
        3,
        |_| true,
        |i| if i == 0 { vec![] } else { norm(i) },
    );
    let plan = wload_json(&[
        "plan",
        s(ckpt.path()),
        "--tp",
        "1",
        "--mapping",
        s(&file),
        "--json",
    ]);
    let tensors = plan["ranks"][0]["tensors"].as_array().unwrap();
    let shapes: Vec<(String, Value)> = tensors
        .iter()
        .filter(|t| t["name"].as_str().unwrap().ends_with("gate_norm.weight"))
        .map(|t| (t["name"].as_str().unwrap().to_string(), t["shape"].clone()))
        .collect();
    assert_eq!(
        shapes,
        [
            ("model.layers.1.gate_norm.weight".to_string(), json!([16])),
            ("model.layers.2.gate_norm.weight".to_string(), json!([24])),
        ]
    );
}

fn refused_mapping(dir: &Path, body: &str) -> String {
    let file = dir.join("bad.yaml");
    fs::write(&file, body).unwrap();
    let ckpt = tiny_checkpoint();
    let out = wload()
        .args(["plan", s(ckpt.path()), "--tp", "1", "--mapping", s(&file)])
        .output()
        .unwrap();
    // Which of the test's several bodies failed, before the common checks.
    assert_eq!(out.status.code(), Some(2), "{body}\n→ {}", stderr(&out));
    assert_refusal_text(&out, 2, &["bad.yaml"])
}

#[test]
fn mistakes_in_a_users_edits_are_the_files_fault() {
    let dir = TempDir::new().unwrap();
    let head = "extends: llama\nfamily: bad\narchitectures: [LlamaForCausalLM]\n";
    let cases = [
        (
            "parameters:\n  layer:\n    - remove: q_norm\n",
            "no parameter or block named 'q_norm'",
        ),
        (
            "parameters:\n  layer:\n    - {use: routed_experts, after: attention_scales}\n",
            "`{moe}` is not filled in",
        ),
        (
            "parameters:\n  layer:\n    - {use: qk_norm}\n",
            "no block named 'qk_norm' (blocks: attention, attention_scales, qk_norms",
        ),
        (
            "derive:\n  odd: \"i % 2\"\nchecks:\n  - {rule: \"odd == 0\", message: m}\n",
            "reads odd, which depends on the layer index",
        ),
        (
            "parameters:\n  layer:\n    - {name: x, use: dense_mlp}\n",
            "exactly one of them",
        ),
    ];
    for (body, says) in cases {
        let err = refused_mapping(dir.path(), &format!("{head}{body}"));
        assert!(err.contains(says), "{body}\n→ {err}");
    }
    let err = refused_mapping(dir.path(), "extends: llama3\nfamily: bad\n");
    assert!(
        err.contains("extends unknown family 'llama3' (shipped: "),
        "{err}"
    );
}
