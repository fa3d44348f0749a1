//! The `ignore` list's `re:` entries are matched as vLLM 0.33 matches them: `regex.match`, anchored
//! at the start of the module name only (config_utils.py `is_equal_or_regex_match`). A layer an
//! entry names by its prefix is unquantized to vLLM: wload plans BF16 weights for it, refuses a
//! checkpoint that packs it, and shards one that stores it in BF16.

use std::path::Path;

use serde_json::json;

use crate::support::*;

const W4A16: &str = "llama_gqa_w4a16";
const LAYER0_ATTN: &str = r"re:model\.layers\.0\.self_attn";

/// The W4A16 fixture with layer 0's attention stored as BF16 `weight`s (as a checkpoint whose
/// quantizer skipped it writes them), and `ignore` set to `ignore`.
fn with_bf16_layer0_attention(ignore: serde_json::Value) -> tempfile::TempDir {
    let dir = fixture_with(W4A16, |c| {
        c["quantization_config"]["ignore"] = ignore;
    });
    let path = dir.path().join("model.safetensors");
    let mut tensors = read_files(std::slice::from_ref(&path));
    let attn = "model.layers.0.self_attn.";
    for proj in ["q_proj", "k_proj", "v_proj", "o_proj"] {
        let packed = tensors
            .remove(&format!("{attn}{proj}.weight_packed"))
            .unwrap();
        tensors.remove(&format!("{attn}{proj}.weight_scale"));
        tensors.remove(&format!("{attn}{proj}.weight_shape"));
        // Eight INT4 values per int32 word.
        let shape = vec![packed.shape[0], packed.shape[1] * 8];
        let n = (shape[0] * shape[1]) as usize;
        tensors.insert(
            format!("{attn}{proj}.weight"),
            Held {
                dtype: "BF16".into(),
                shape,
                data: (0..n)
                    .flat_map(|i| (0x3C00u16 | (i % 97) as u16).to_le_bytes())
                    .collect(),
            },
        );
    }
    let list: Vec<(&str, &str, &[u64], &[u8])> = tensors
        .iter()
        .map(|(k, t)| (k.as_str(), t.dtype.as_str(), &t.shape[..], &t.data[..]))
        .collect();
    write_safetensors(&path, &list);
    dir
}

fn plan_json(source: &Path) -> serde_json::Value {
    wload_json(&["plan", s(source), "--tp", "2", "--json"])
}

/// A prefix entry leaves layer 0's attention unquantized, as vLLM does: the BF16 checkpoint is
/// planned and sharded with BF16 weights there and packed ones elsewhere.
#[test]
fn a_prefix_ignore_entry_keeps_the_layer_it_starts_unquantized() {
    let dir = with_bf16_layer0_attention(json!(["lm_head", LAYER0_ATTN]));
    let plan = plan_json(dir.path());
    let names: Vec<&str> = plan["ranks"][0]["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    for want in [
        "model.layers.0.self_attn.qkv_proj.weight",
        "model.layers.0.self_attn.o_proj.weight",
        "model.layers.1.self_attn.qkv_proj.weight_packed",
    ] {
        assert!(names.contains(&want), "{want} not planned: {names:?}");
    }
    assert!(
        !names.contains(&"model.layers.0.self_attn.qkv_proj.weight_packed"),
        "{names:?}"
    );
    let tmp = tempfile::tempdir().unwrap();
    shard_ok(dir.path(), 2, &tmp.path().join("out"), &[]);
}

/// The packed fixture under the same entry is what vLLM fails on (it builds BF16 `weight`s for
/// layer 0's attention, which the checkpoint does not hold): refused, naming the layer.
#[test]
fn a_prefix_ignore_entry_refuses_a_checkpoint_that_packs_that_layer() {
    let dir = fixture_with(W4A16, |c| {
        c["quantization_config"]["ignore"] = json!(["lm_head", LAYER0_ATTN]);
    });
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    assert_refusal_text(
        &shard(dir.path(), 2, &out, &[]),
        3,
        &["model.layers.0.self_attn"],
    );
    assert!(!out.exists());
    // Matched at the start only, not searched: an entry naming the middle of a module name
    // ignores nothing, and the packed checkpoint shards.
    let dir = fixture_with(W4A16, |c| {
        c["quantization_config"]["ignore"] = json!(["lm_head", r"re:layers\.0\.self_attn"]);
    });
    shard_ok(dir.path(), 2, &tmp.path().join("searched"), &[]);
}
