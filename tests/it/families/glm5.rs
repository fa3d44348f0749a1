//! GLM-5 / GLM-5.2 (`GlmMoeDsaForCausalLM`, DeepSeek-V3.2's CUDA module tree): which layers carry
//! a DSA indexer, and the refusals vLLM 0.33 makes (vllm-spec §12.0, §12.3, §12.4). The golden
//! cases `glm5_fp8/tp2` and `glm5_2_fp8_indexshare/tp2` check the bytes (tests/it/golden.rs).

use std::path::Path;

use serde_json::{Map, Value, json};
use tempfile::TempDir;

use crate::support::*;

const INDEXSHARE: &str = "glm5_2_fp8_indexshare";

/// The five indexer parameters vLLM builds on layer `i` of an FP8 checkpoint.
fn indexer_params(i: u64) -> Vec<String> {
    [
        "wq_b.weight",
        "wq_b.weight_scale_inv",
        "wk_weights_proj.weight",
        "k_norm.weight",
        "k_norm.bias",
    ]
    .iter()
    .map(|p| format!("model.layers.{i}.self_attn.indexer.{p}"))
    .collect()
}

/// The config as transformers 5.20 writes GLM-5.2's: `indexer_types` alone, no vLLM key.
fn types_only(m: &mut Map<String, Value>) {
    m.remove("index_topk_freq")
        .expect("the fixture has index_topk_freq");
    assert_eq!(m["indexer_types"], json!(["full", "full", "shared"]));
}

/// The words of the refusal: every missing tensor of layer 2, why, and the keys that fix it.
const WHY: &[&str] = &[
    "indexer_types says 'shared' for this layer, but vLLM 0.33 does not read indexer_types",
    "no index_topk_freq or index_topk_pattern",
    "indexer_types [\"full\",\"full\",\"shared\"]",
    "Add to config.json index_topk_pattern",
    "index_topk_freq (with index_skip_topk_offset",
];

fn assert_types_only_refused(dir: &Path, params: &[String]) {
    let err = assert_refusal_text(&run(&["plan", s(dir), "--tp", "2"]), 3, WHY);
    for p in params {
        assert!(err.contains(&format!("'{p}' has nothing")), "{p}: {err}");
    }
    // Layers 0 and 1 have their indexer: not named.
    assert!(
        !err.contains("model.layers.0.") && !err.contains("model.layers.1."),
        "{err}"
    );
    // `sizes` says why at every TP size.
    let sizes = run(&["sizes", s(dir), "--max-tp", "2"]);
    assert!(stdout(&sizes).contains(WHY[0]), "{}", context(&sizes));
    let out = TempDir::new().unwrap();
    let o = out.path().join("out");
    assert_refusal_text(&shard(dir, 2, &o, &[]), 3, WHY);
    assert!(!o.join("model-rank-0-part-0.safetensors").exists());
}

/// FP8 (vLLM loads it silently, serving an indexer that was never loaded: wq_b's scale stays
/// -3.4e38): refused, every tensor of layer 2's indexer named, with why.
#[test]
fn glm5_2_fp8_with_indexer_types_only_is_refused_saying_why() {
    let dir = fixture_with(INDEXSHARE, types_only);
    assert_types_only_refused(dir.path(), &indexer_params(2));
}

/// BF16 (vLLM refuses, naming only `k_norm.weight` / `.bias`): refused with the whole list.
#[test]
fn glm5_2_bf16_with_indexer_types_only_is_refused_saying_why() {
    let dir = bf16_twin(types_only);
    let mut want = indexer_params(2);
    want.retain(|p| !p.ends_with("weight_scale_inv"));
    assert_types_only_refused(dir.path(), &want);
}

/// The fix the refusal gives: vLLM's own key naming the shared layer. With it the keys are the
/// golden case's (layer 2 without an indexer), whichever key says it.
#[test]
fn index_topk_pattern_names_the_shared_layers_as_index_topk_freq_does() {
    let golden = clean_plan_json(&fixture(INDEXSHARE), &["--tp", "2"]);
    let pattern = fixture_with(INDEXSHARE, |m| {
        types_only(m);
        m.insert("index_topk_pattern".into(), json!("FFS"));
    });
    let with_pattern = clean_plan_json(pattern.path(), &["--tp", "2"]);
    let keys = |plan: &Value| -> Vec<String> {
        plan.to_string()
            .split('"')
            .filter(|w| w.starts_with("model.layers.") && w.contains(".indexer."))
            .map(String::from)
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect()
    };
    let k = keys(&with_pattern);
    assert_eq!(k, keys(&golden));
    assert!(
        k.iter()
            .any(|n| n.starts_with("model.layers.1.self_attn.indexer.")),
        "{k:?}"
    );
    assert!(!k.iter().any(|n| n.starts_with("model.layers.2.")), "{k:?}");
}

/// A GLM-5 config whose `indexer_types` is all `full` (GLM-5, GLM-5.1) gives no IndexShare
/// hint when a tensor is missing: the generic fix stays.
#[test]
fn a_missing_indexer_without_shared_layers_gets_the_generic_fix() {
    let dir = fixture_with(INDEXSHARE, |m| {
        types_only(m);
        m.insert("indexer_types".into(), json!(["full", "full", "full"]));
    });
    let err = assert_refusal_text(
        &run(&["plan", s(dir.path()), "--tp", "2"]),
        3,
        &[
            "'model.layers.2.self_attn.indexer.k_norm.bias' has nothing",
            "check the names with `wload inspect`",
        ],
    );
    assert!(!err.contains("indexer_types says"), "{err}");
}

/// GLM-5 FP8 with 32-blocks at TP 8: kv_b_proj holds 1 head × (32 + 48) = 80 rows per rank, and
/// vLLM 0.33 refuses in `validate_fp8_block_shape` (fp8_utils.py:1340, from
/// deepseek_v32/attention.py:182) with these words (vllm-spec §12.0).
#[test]
fn glm5_fp8_block_32_at_tp8_is_refused_in_vllms_words() {
    let f = fixture("glm5_fp8");
    let vllm =
        "Weight output_partition_size = 80 is not divisible by weight quantization block_n = 32.";
    let err = assert_refusal_text(
        &run(&["plan", s(&f), "--tp", "8"]),
        3,
        &[
            &format!("model.layers.0.self_attn.kv_b_proj.weight_scale_inv: {vllm}"),
            "TP sizes that work: 1, 2, 4",
        ],
    );
    assert!(err.contains("choose another --tp (now 8)"), "{err}");
    clean_plan_json(&f, &["--tp", "4"]);
}

/// The BF16 twin of the IndexShare fixture (header-exact shapes, zero data): every F8 tensor
/// BF16, no scales, no quantization_config; `edit` changes its config.
fn bf16_twin(edit: impl FnOnce(&mut Map<String, Value>)) -> TempDir {
    let src = fixture(INDEXSHARE);
    let raw = RawFile::read(&src.join("model.safetensors"));
    let mut specs: Vec<(String, Vec<u64>)> = Vec::new();
    for (name, t) in raw.header() {
        if name == "__metadata__" || name.ends_with("weight_scale_inv") {
            continue;
        }
        let shape: Vec<u64> = serde_json::from_value(t["shape"].clone()).unwrap();
        specs.push((name, shape));
    }
    let data: Vec<Vec<u8>> = (specs.iter())
        .map(|(_, sh)| zeros(2 * sh.iter().product::<u64>() as usize))
        .collect();
    let tensors: Vec<Tensor> = (specs.iter().zip(&data))
        .map(|((n, sh), d)| (n.as_str(), "BF16", sh.as_slice(), d.as_slice()))
        .collect();
    let dir = TempDir::new().unwrap();
    write_safetensors(&dir.path().join("model.safetensors"), &tensors);
    let mut m = read_config(&src);
    m.remove("quantization_config");
    edit(&mut m);
    write_config(dir.path(), m);
    dir
}
