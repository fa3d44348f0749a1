//! Spellings of the quantization config that vLLM normalizes.

use super::*;

// ---------------------------------------------------------------------------------------------
// 9. Spellings of the quantization config that vLLM normalizes
// ---------------------------------------------------------------------------------------------

/// A copy of `name` with `edit` applied to its config.json, sharded at TP 2, gives exactly vLLM's
/// TP 2 output `case` of the unedited fixture.
fn config_spelling_shards_as(name: &str, case: &str, edit: impl FnOnce(&mut Value)) {
    let src = copy_fixture(name);
    edit_config(src.path(), edit);
    let tmp = TempDir::new().unwrap();
    let out = tmp.path().join("out");
    shard_ok(src.path(), 2, &out, &["-q"]);
    assert_ranks_equal(&out, case, |_, _| {});
}

/// vLLM lower-cases `quant_method` (`_normalize_quantization_config` in
/// transformers_utils/model_arch_config_convertor.py).
#[test]
fn quant_method_is_case_insensitive_as_in_vllm() {
    config_spelling_shards_as("llama_gqa_fp8_tensor", "llama_gqa__fp8_tensor", |c| {
        c["quantization_config"]["quant_method"] = json!("FP8");
    });
}

/// vLLM rewrites `compressed_tensors` to `compressed-tensors` (same function).
#[test]
fn compressed_tensors_with_an_underscore_is_compressed_tensors() {
    config_spelling_shards_as(
        "llama_gqa_ct_fp8_dynamic",
        "llama_gqa_ct_fp8_dynamic",
        |c| {
            c["quantization_config"]["quant_method"] = json!("compressed_tensors");
        },
    );
}

/// Older compressed-tensors checkpoints keep the config under `compression_config`; vLLM reads it
/// when there is no `quantization_config` (same function).
#[test]
fn compression_config_is_read_when_there_is_no_quantization_config() {
    config_spelling_shards_as(
        "llama_gqa_ct_fp8_dynamic",
        "llama_gqa_ct_fp8_dynamic",
        |c| {
            let qc = c
                .as_object_mut()
                .unwrap()
                .remove("quantization_config")
                .unwrap();
            c["compression_config"] = qc;
        },
    );
}

/// `--dtype float16`: the unquantized tensors are vLLM's float16 output of llama_gqa, the KV
/// scale parameters are float16 -1.0 (the model dtype), and the FP8 weights and F32 scales are
/// unchanged.
#[test]
fn fp8_in_float16_converts_only_the_unquantized_tensors() {
    let tmp = TempDir::new().unwrap();
    let out = tmp.path().join("out");
    shard_ok(
        &fixture("llama_gqa_fp8_tensor"),
        2,
        &out,
        &["-q", "--dtype", "float16"],
    );
    assert_ranks_equal(&out, "llama_gqa__fp8_tensor", |r, want| {
        let f16 = rank_tensors(&expected("llama_gqa__dtype_float16", 2), r);
        for (name, t) in want.iter_mut() {
            if name.contains(".attn.") && !name.contains(".attn._") {
                *t = Held {
                    dtype: "F16".into(),
                    shape: vec![],
                    data: 0xbc00u16.to_le_bytes().to_vec(),
                };
            } else if t.dtype == "BF16" {
                *t = f16[name].clone();
            }
        }
    });
}

/// At TP 8 o_proj's scale columns run past the checkpoint's because each rank's 16 input columns
/// are less than a 32-column block; whatever else is said, an explanation that o_proj's output
/// partition [128] is not a multiple of 32 is false and sends the user the wrong way.
#[test]
fn block_fp8_row_parallel_refusal_explains_the_input_partition() {
    let err = shard_refused(&fixture("llama_gqa_fp8_block"), 8, &["-q"], &["o_proj"]);
    assert!(
        !err.contains("output partitions [128] are not multiples of block_n = 32"),
        "{err}"
    );
}
