//! What vLLM cannot load is refused, by name, before anything is written.

use super::*;

// ---------------------------------------------------------------------------------------------
// 2. What vLLM cannot load is refused, by name, before anything is written
// ---------------------------------------------------------------------------------------------

/// At TP 4 each rank's k and v partitions are 16 rows, half a 32-row block: vLLM's ceil-block
/// slicing reads k/v scale rows past the checkpoint's 2 (ranks 2 and 3), and its loader fails.
#[test]
fn block_fp8_at_tp4_is_refused_because_kv_blocks_run_past_the_scale() {
    let err = shard_refused(
        &fixture("llama_gqa_fp8_block"),
        4,
        &[],
        &[
            "model.layers.0.self_attn.qkv_proj.weight_scale_inv",
            "model.layers.1.self_attn.qkv_proj.weight_scale_inv",
            "do not align with this TP size",
            "block_n = 32",
            "--tp",
        ],
    );
    assert!(
        !err.contains("o_proj"),
        "o_proj has 32 input columns per rank at TP 4: {err}"
    );
}

/// At TP 8 o_proj's 16 input columns per rank are not a whole 32-column block: vLLM's
/// `validate_fp8_block_shape` refuses with this exact message.
#[test]
fn block_fp8_at_tp8_is_refused_with_vllms_block_k_message() {
    shard_refused(
        &fixture("llama_gqa_fp8_block"),
        8,
        &[],
        &[
            "model.layers.0.self_attn.o_proj.weight_scale_inv: Weight input_size_per_partition = 16 is not divisible by weight quantization block_k = 32.",
            "model.layers.1.self_attn.o_proj.weight_scale_inv",
            "choose another --tp (now 8)",
        ],
    );
}

/// Quantization methods whose weights have their own packed layouts are refused by name.
#[test]
fn other_quantization_methods_are_refused_by_name() {
    let ct = |format: &str, wtype: &str, bits: u64| {
        json!({
            "quant_method": "compressed-tensors",
            "format": format,
            "quantization_status": "compressed",
            "ignore": ["lm_head"],
            "config_groups": {"group_0": {
                "targets": ["Linear"],
                "weights": {"type": wtype, "num_bits": bits, "strategy": "group",
                            "group_size": 16, "symmetric": true, "dynamic": false},
                "input_activations": null
            }}
        })
    };
    // GPTQ and AWQ are written (formats/gptq/); bitsandbytes is gone from vLLM 0.33.
    let cases: [(Value, &[&str]); 5] = [
        (
            json!({"quant_method": "mxfp4"}),
            &[
                "quant_method = \"mxfp4\" on model_type \"llama\"",
                "generic Mxfp4Config",
            ],
        ),
        (
            json!({"quant_method": "bitsandbytes", "load_in_4bit": true, "bnb_4bit_quant_type": "nf4"}),
            &["Unknown quantization method: bitsandbytes. Must be one of ["],
        ),
        // llm-compressor W2A16 (2-bit ints packed into int32): vLLM packs it, wload does not.
        (
            ct("pack-quantized", "int", 2),
            &["compressed-tensors pack-quantized with num_bits = 2 is not supported by wload"],
        ),
        // NVFP4 with plain group scales: vLLM's NVFP4 scheme needs tensor_group (ct_nvfp4.rs).
        (
            ct("nvfp4-pack-quantized", "float", 4),
            &[
                "nvfp4-pack-quantized weights must be NVFP4",
                "strategy \"group\"",
            ],
        ),
        // A 4-bit float scheme declared under the FP8 format name.
        (
            ct("float-quantized", "float", 4),
            &["compressed-tensors weights of type \"float\" with 4 bits are not supported"],
        ),
    ];
    for (qc, needles) in cases {
        let src = copy_fixture("llama_gqa_fp8_tensor");
        edit_config(src.path(), |c| c["quantization_config"] = qc.clone());
        shard_refused(src.path(), 2, &["-q"], needles);
    }
}

#[test]
fn fp8_in_float32_is_refused_as_vllm_does() {
    shard_refused(
        &fixture("llama_gqa_fp8_tensor"),
        2,
        &["--dtype", "float32"],
        &[
            "torch.float32 is not supported for quantization method fp8",
            "--dtype bfloat16",
        ],
    );
}

/// vLLM cannot run a fused qkv_proj whose q part is unquantized and k/v parts FP8.
#[test]
fn a_fused_layer_quantized_only_in_part_is_refused() {
    let src = copy_fixture("llama_gqa_fp8_tensor");
    edit_config(src.path(), |c| {
        c["quantization_config"]["ignored_layers"] = json!(["model.layers.0.self_attn.q_proj"]);
    });
    shard_refused(
        src.path(),
        2,
        &["-q"],
        &["Detected some but not all shards of model.layers.0.self_attn.qkv_proj are quantized"],
    );
}

/// Without k_proj's scale, vLLM would leave the k slot at float32's minimum and dequantize k with
/// it: refused, naming the parameter and the shard.
#[test]
fn a_missing_weight_scale_is_refused_naming_the_parameter() {
    let src = copy_fixture("llama_gqa_fp8_tensor");
    rewrite_model(src.path(), |t| {
        t.retain(|(n, _)| n != "model.layers.0.self_attn.k_proj.weight_scale");
    });
    shard_refused(
        src.path(),
        2,
        &["-q"],
        &[
            "model.layers.0.self_attn.qkv_proj.weight_scale",
            "nothing in the checkpoint to fill it (missing shard k)",
        ],
    );
}

/// A BF16 q_proj in a checkpoint whose config says FP8: vLLM would copy it into an FP8 parameter.
#[test]
fn an_unquantized_weight_where_the_config_says_fp8_is_refused() {
    let src = copy_fixture("llama_gqa_fp8_tensor");
    rewrite_model(src.path(), |t| {
        let (_, w) = t
            .iter_mut()
            .find(|(n, _)| n == "model.layers.0.self_attn.q_proj.weight")
            .expect("q_proj.weight in the fixture");
        w.dtype = "BF16".into();
        w.data = [0x80, 0x3f].repeat(w.data.len());
    });
    let err = shard_refused(
        src.path(),
        2,
        &["-q"],
        &[
            "model.layers.0.self_attn.q_proj.weight",
            "cannot be converted",
        ],
    );
    assert!(
        err.contains("ignored_layers") || err.contains("modules_to_not_convert"),
        "the fix should say how to keep the layer unquantized: {err}"
    );
}
