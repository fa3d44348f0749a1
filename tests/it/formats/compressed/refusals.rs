//! What vLLM 0.33 refuses in compressed-tensors integer and kv-cache schemes is refused up
//! front, in vLLM's words, naming the config key or the layer, the rule and the fix; nothing is
//! written.

use std::path::Path;

use serde_json::{Map, Value, json};

use crate::support::*;

const W4A16: &str = "llama_gqa_w4a16";

fn refused(source: &Path, tp: u64, extra: &[&str], needles: &[&str]) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let err = assert_refusal_text(&shard(source, tp, &out, extra), 3, needles);
    assert!(!out.exists(), "refused, yet {} was created", out.display());
    err
}

/// The W4A16 fixture with `edit` applied to its quantization_config.
fn w4a16_with(edit: impl FnOnce(&mut Map<String, Value>)) -> tempfile::TempDir {
    fixture_with(W4A16, |c| {
        let qc = c["quantization_config"].as_object_mut().unwrap();
        edit(qc);
    })
}

fn weights(qc: &mut Map<String, Value>) -> &mut Map<String, Value> {
    qc["config_groups"]["group_0"]["weights"]
        .as_object_mut()
        .unwrap()
}

/// At TP 8 o_proj's 16 input columns per rank are half a 32-column group:
/// `verify_group_size_divides_partition` (distributed/utils.py:137).
#[test]
fn a_group_that_does_not_divide_a_ranks_input_is_refused_with_vllms_words() {
    let err = refused(
        &fixture(W4A16),
        8,
        &[],
        &[
            "Weight input_size_per_partition=16 for layer 'model.layers.0.self_attn.o_proj' is not divisible by group_size=32.",
            "for layer 'model.layers.1.self_attn.o_proj'",
            "use a --tp that splits 128 columns into whole groups of 32 (tp 1, 2, 4)",
        ],
    );
    // down_proj's 256 columns are 32 per rank at TP 8: whole groups.
    assert!(!err.contains("down_proj"), "{err}");
    assert!(!err.contains("matches no parameter"), "{err}");
    assert!(
        err.contains("2 problems found"),
        "one problem per refused layer: {err}"
    );
}

/// compressed_tensors.py:336–344.
#[test]
fn group_and_dynamic_activation_ordering_are_refused() {
    for order in ["group", "dynamic"] {
        let dir = w4a16_with(|qc| {
            weights(qc).insert("actorder".into(), json!(order));
        });
        refused(
            dir.path(),
            2,
            &[],
            &[
                &format!(
                    "Compressed-tensors group/dynamic activation ordering (actorder='{order}') is no longer supported (config_groups.group_0.weights.actorder)"
                ),
                "re-quantize with actorder \"static\"",
            ],
        );
    }
    let dir = w4a16_with(|qc| {
        weights(qc).insert("actorder".into(), json!("static"));
    });
    shard_ok(
        dir.path(),
        2,
        &tempfile::tempdir().unwrap().path().join("o"),
        &[],
    );
}

#[test]
fn bit_widths_are_refused_by_name() {
    let dir = w4a16_with(|qc| {
        weights(qc).insert("num_bits".into(), json!(16));
    });
    refused(
        dir.path(),
        2,
        &[],
        &[
            "Unsupported num_bits = 16. Supported num_bits = [2, 3, 4, 5, 6, 7, 8] (config_groups.group_0.weights.num_bits)",
            "2 to 8 bits",
        ],
    );
    let dir = w4a16_with(|qc| {
        weights(qc).insert("num_bits".into(), json!(3));
    });
    refused(
        dir.path(),
        2,
        &[],
        &[
            "num_bits = 3 is not supported by wload (config_groups.group_0.weights.num_bits)",
            "use the unquantized",
        ],
    );
}

/// W8A8 INT8 takes symmetric weights only (compressed_tensors.py:527–529); the kv cache only
/// symmetric scales (l.1133–1140).
#[test]
fn asymmetric_schemes_vllm_refuses_are_refused() {
    let dir = fixture_with("llama_gqa_ct_w8a8_int8", |c| {
        c["quantization_config"]["config_groups"]["group_0"]["weights"]["symmetric"] = json!(false);
    });
    refused(
        dir.path(),
        2,
        &[],
        &[
            "INT8 weights must be static and symmetric",
            "Only symmetric weight quantization supported",
        ],
    );
    let dir = fixture_with("llama_kv2_ct_fp8_kv_head", |c| {
        c["quantization_config"]["kv_cache_scheme"]["symmetric"] = json!(false);
    });
    refused(
        dir.path(),
        2,
        &[],
        &[
            "Only support symmetric scaling factor for compressed-tensors KV cache. However found symmetric: false (quantization_config.kv_cache_scheme.symmetric)",
            "per-tensor or per-head kv_cache_scheme",
        ],
    );
}

#[test]
fn kv_cache_schemes_vllm_refuses_are_refused() {
    let dir = fixture_with("llama_kv2_ct_fp8_kv_head", |c| {
        c["quantization_config"]["kv_cache_scheme"]["type"] = json!("int");
    });
    refused(
        dir.path(),
        2,
        &[],
        &[
            "Currently supported kv cache quantization is num_bits=8, type=float, however received num_bits=8, type=int",
        ],
    );
    let dir = fixture_with("llama_kv2_ct_fp8_kv_head", |c| {
        c["quantization_config"]["kv_cache_scheme"]["strategy"] = json!("channel");
    });
    refused(
        dir.path(),
        2,
        &[],
        &[
            "Invalid strategy for compressed-tensors KV cache. Expected strategies: (tensor, attn_head), found strategy: channel",
            "remove kv_cache_scheme",
        ],
    );
}

/// compressed_tensors_moe_wna16.py:245–257: at TP 4 each rank holds 16 of an expert's 64
/// intermediate rows, half a 32-column group; expert parallelism keeps experts whole.
#[test]
fn moe_groups_across_tp_shards_are_refused_and_ep_is_the_fix() {
    let ignore = json!([
        "lm_head",
        "re:.*self_attn.*",
        "re:.*shared_experts.*",
        "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"
    ]);
    let dir = fixture_with("deepseek_v3", |c| {
        c.insert(
            "quantization_config".into(),
            super::wna16_config(4, Some(32), true, ignore),
        );
    });
    // The bf16 expert weights do not matter: the sizes are refused first.
    let err = refused(
        dir.path(),
        4,
        &[],
        &[
            "model.layers.1.mlp.experts: CompressedTensors WNA16 MoE with static group scales requires the MoE intermediate size per tensor-parallel partition (16) to be divisible by group_size (32).",
            "use a compatible TP size or enable expert parallelism (--enable-expert-parallel)",
        ],
    );
    assert!(!err.contains("(64)"), "{err}");
}
