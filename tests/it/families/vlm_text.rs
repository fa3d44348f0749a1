//! Mistral 3 and Gemma 3 vision-language checkpoints served text-only: with
//! `--language-model-only`, the text model under `language_model.` (spec §11.1 "VLMs served
//! text-only"), the tower's tensors skipped as vLLM skips them, and the flag in the serve line.
//! Small generated checkpoints, every byte distinct (their towers: families::towers).

use std::path::Path;

use serde_json::{Value, json};
use tempfile::TempDir;

use crate::support::*;

/// A tiny Llama-shaped text model (hidden 8, 2 heads of 4, 1 kv head, vocab 16, one layer, BF16)
/// named by `name` (`None`: left out), and `extra`; with `tower`, two tower and one projector
/// tensor. Every value is distinct.
fn write_vlm(
    dir: &Path,
    config: Value,
    name: impl Fn(&str) -> Option<String>,
    extra: &[(&str, &[u64])],
    tower: bool,
) {
    std::fs::create_dir_all(dir).unwrap();
    write_json(&dir.join("config.json"), &config);
    let mut specs: Vec<(String, Vec<u64>)> = tiny_llama_specs(1)
        .into_iter()
        .map(|(n, sh)| (n, sh.to_vec()))
        .chain(extra.iter().map(|(n, sh)| (n.to_string(), sh.to_vec())))
        .filter_map(|(n, sh)| Some((name(&n)?, sh)))
        .collect();
    let tower_tensors = [
        (
            "vision_tower.patch_conv.weight".to_string(),
            vec![4, 3, 2, 2],
        ),
        ("vision_tower.ln_pre.weight".to_string(), vec![4]),
        (
            "multi_modal_projector.linear_1.weight".to_string(),
            vec![8, 4],
        ),
    ];
    if tower {
        specs.extend(tower_tensors);
    }
    let data: Vec<Vec<u8>> = specs
        .iter()
        .enumerate()
        .map(|(k, (_, sh))| {
            let n = sh.iter().product::<u64>() as usize;
            // BF16 bit patterns, distinct within a tensor, finite (exponent never all ones).
            (0..n)
                .flat_map(|e| (0x3C00 + ((k * 128 + e) % 0x3000) as u16).to_le_bytes())
                .collect()
        })
        .collect();
    let tensors: Vec<Tensor> = specs
        .iter()
        .zip(&data)
        .map(|((n, sh), d)| (n.as_str(), "BF16", sh.as_slice(), d.as_slice()))
        .collect();
    write_safetensors(&dir.join("model.safetensors"), &tensors);
}

fn text_config(model_type: &str) -> Value {
    let mut t = tiny_config();
    t["model_type"] = json!(model_type);
    t["dtype"] = json!("bfloat16");
    t.as_object_mut().unwrap().remove("architectures");
    t
}

fn vlm_config(arch: &str, text: Value) -> Value {
    json!({
        "architectures": [arch],
        "model_type": "vlm",
        "text_config": text,
        "vision_config": {"hidden_size": 4, "num_attention_heads": 2, "model_type": "pixtral"},
        "dtype": "bfloat16"
    })
}

/// With the flag the tower's three tensors are skipped, the serve line says it, and `load`
/// takes it back from wload.json.
fn text_only(src: &Path) -> (TempDir, std::path::PathBuf) {
    let plan = clean_plan_json(src, &["--tp", "2", "--language-model-only"]);
    let skipped = skipped_tensors(&plan, "--language-model-only");
    assert_eq!(
        skipped,
        [
            "multi_modal_projector.linear_1.weight",
            "vision_tower.ln_pre.weight",
            "vision_tower.patch_conv.weight"
        ]
    );
    let tmp = TempDir::new().unwrap();
    let out = tmp.path().join("out");
    shard_ok(src, 2, &out, &["-q", "--language-model-only"]);
    let m: Value = serde_json::from_slice(&std::fs::read(out.join("wload.json")).unwrap()).unwrap();
    assert!(
        m["serve"]["argv"]
            .as_array()
            .unwrap()
            .contains(&json!("--language-model-only"))
    );
    let load = run(&["load", s(&out), "--dry-run"]);
    assert!(load.status.success(), "{}", context(&load));
    (tmp, out)
}

/// Mistral 3 (transformers ≥ 4.52 names): the text model is exactly the Llama/Mistral text
/// checkpoint's, under `language_model.`.
#[test]
fn mistral3_is_its_text_model_under_language_model() {
    let tmp = TempDir::new().unwrap();
    let (vlm, text) = (tmp.path().join("vlm"), tmp.path().join("text"));
    let renamed = |n: &str| {
        Some(match n.strip_prefix("model.") {
            Some(rest) => format!("model.language_model.{rest}"),
            None => n.to_string(),
        })
    };
    write_vlm(
        &vlm,
        vlm_config("Mistral3ForConditionalGeneration", text_config("mistral")),
        renamed,
        &[],
        true,
    );
    let mut plain = tiny_config();
    plain["architectures"] = json!(["MistralForCausalLM"]);
    plain["model_type"] = json!("mistral");
    plain["dtype"] = json!("bfloat16");
    write_vlm(&text, plain, |n| Some(n.to_string()), &[], false);
    let (_keep, out) = text_only(&vlm);
    let text_out = tmp.path().join("text-out");
    shard_ok(&text, 2, &text_out, &["-q"]);
    for r in 0..2 {
        let (got, want) = (rank_tensors(&out, r), rank_tensors(&text_out, r));
        let want: Vec<(String, &Held)> = want
            .iter()
            .map(|(k, v)| (format!("language_model.{k}"), v))
            .collect();
        assert_eq!(got.len(), want.len(), "rank {r}: {:?}", got.keys());
        for (k, v) in want {
            assert!(
                got[&k].data == v.data && got[&k].shape == v.shape,
                "rank {r} {k}"
            );
        }
    }
}

/// Gemma 3 (the legacy names the Hub repos use: `language_model.model.*`, no lm_head, tied):
/// Gemma 2's four norms plus q/k norms, and only `language_model.lm_head.weight` saved, first
/// (spec §11.1: the embedding is dropped as storage-shared).
#[test]
fn gemma3_is_its_text_model_with_only_the_lm_head_saved() {
    let tmp = TempDir::new().unwrap();
    let mut text = text_config("gemma3_text");
    text["tie_word_embeddings"] = json!(true);
    text["head_dim"] = json!(4);
    // Gemma checkpoints have no lm_head.
    let legacy = |n: &str| match n {
        "lm_head.weight" => None,
        _ => Some(format!("language_model.{n}")),
    };
    let norms: &[(&str, &[u64])] = &[
        ("model.layers.0.self_attn.q_norm.weight", &[4]),
        ("model.layers.0.self_attn.k_norm.weight", &[4]),
        ("model.layers.0.pre_feedforward_layernorm.weight", &[8]),
        ("model.layers.0.post_feedforward_layernorm.weight", &[8]),
    ];
    let src = tmp.path().join("gemma3");
    write_vlm(
        &src,
        vlm_config("Gemma3ForConditionalGeneration", text),
        legacy,
        norms,
        true,
    );
    let (_keep, out) = text_only(&src);
    // vLLM's state_dict order, as the plan lists rank 0's tensors; the files hold the same set.
    let plan = clean_plan_json(&src, &["--tp", "2", "--language-model-only"]);
    let meta_keys: Vec<String> = plan["ranks"][0]["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect();
    let mut in_file: Vec<String> = header_tensors(&out.join("model-rank-0-part-0.safetensors"))
        .into_iter()
        .map(|t| t.name)
        .collect();
    in_file.sort();
    let mut sorted = meta_keys.clone();
    sorted.sort();
    assert_eq!(in_file, sorted);
    let p = "language_model.model.layers.0";
    let want: Vec<String> = [
        "language_model.lm_head.weight".to_string(),
        format!("{p}.self_attn.qkv_proj.weight"),
        format!("{p}.self_attn.o_proj.weight"),
        format!("{p}.self_attn.q_norm.weight"),
        format!("{p}.self_attn.k_norm.weight"),
        format!("{p}.self_attn.attn._k_scale"),
        format!("{p}.self_attn.attn._v_scale"),
        format!("{p}.self_attn.attn._q_scale"),
        format!("{p}.self_attn.attn._prob_scale"),
        format!("{p}.mlp.gate_up_proj.weight"),
        format!("{p}.mlp.down_proj.weight"),
        format!("{p}.input_layernorm.weight"),
        format!("{p}.post_attention_layernorm.weight"),
        format!("{p}.pre_feedforward_layernorm.weight"),
        format!("{p}.post_feedforward_layernorm.weight"),
        "language_model.model.norm.weight".to_string(),
    ]
    .into();
    assert_eq!(meta_keys, want);
    // The lm_head is the embedding's rows (vocab 16 padded to 64, split: rank 0 rows 0..32).
    let ckpt = checkpoint_tensors(&src);
    let got = rank_tensors(&out, 0);
    let head = &got["language_model.lm_head.weight"];
    assert_eq!(head.shape, [32, 8]);
    assert!(
        head.rows(0, 16)
            == ckpt["language_model.model.embed_tokens.weight"]
                .data
                .as_slice()
    );
}
