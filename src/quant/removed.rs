//! Methods vLLM 0.33 no longer loads as they are: bitsandbytes is gone from
//! `QuantizationMethods` (`layers/quantization/__init__.py:15–49`, refused in `config/model.py`
//! :1465–1469), and `fbgemm_fp8` / `fp_quant` are deprecated (:52–55, refused at :1472–1485
//! unless `--allow-deprecated-quantization`).

use super::{QuantError, refuse};

/// vLLM 0.33's `QUANTIZATION_METHODS`, in its order, as its refusal prints the list.
const VLLM_METHODS: &[&str] = &[
    "awq",
    "auto_awq",
    "fp8",
    "fbgemm_fp8",
    "fp_quant",
    "modelopt",
    "modelopt_fp4",
    "modelopt_mxfp8",
    "modelopt_mixed",
    "auto_gptq",
    "gptq",
    "gptq_marlin",
    "awq_marlin",
    "humming",
    "compressed-tensors",
    "experts_int8",
    "quark",
    "moe_wna16",
    "torchao",
    "inc",
    "mxfp4",
    "gpt_oss_mxfp4",
    "deepseek_v4_fp8",
    "online",
    "fp8_per_tensor",
    "fp8_per_block",
    "fp8_per_channel",
    "int8_per_channel_weight_only",
    "nvfp4_per_token",
    "mxfp8",
];

/// The refusal of `method` (bitsandbytes, fbgemm_fp8 or fp_quant).
pub(super) fn refusal(method: &str) -> QuantError {
    if method == "bitsandbytes" {
        let list: Vec<String> = VLLM_METHODS.iter().map(|m| format!("'{m}'")).collect();
        return refuse(
            format!(
                "Unknown quantization method: bitsandbytes. Must be one of [{}].",
                list.join(", ")
            ),
            "vLLM 0.33 removed bitsandbytes (no such method and no bitsandbytes load format): use the model's AWQ, GPTQ or FP8 release, or the unquantized checkpoint",
        );
    }
    refuse(
        format!(
            "The quantization method {method} is deprecated and will be removed in future versions of vLLM. To bypass, set `--allow-deprecated-quantization`. wload does not write {method}: vLLM keeps it only behind that flag"
        ),
        "use the model's FP8 (`quant_method: fp8` or compressed-tensors) or unquantized release",
    )
}

#[cfg(test)]
mod tests {
    use super::super::Quantization;
    use serde_json::json;

    #[test]
    fn removed_and_deprecated_methods_are_refused_with_vllms_words() {
        let e = Quantization::from_config(Some(&json!({"quant_method": "bitsandbytes",
            "load_in_4bit": true})))
        .unwrap_err();
        assert!(
            e.message.starts_with("Unknown quantization method: bitsandbytes. Must be one of ['awq', 'auto_awq', 'fp8',"),
            "{e:?}"
        );
        assert!(e.message.ends_with("'mxfp8']."), "{e:?}");
        assert!(e.fix.contains("removed bitsandbytes"), "{e:?}");
        for m in ["fbgemm_fp8", "fp_quant"] {
            let e = Quantization::from_config(Some(&json!({"quant_method": m}))).unwrap_err();
            assert!(
                e.message
                    .contains(&format!("The quantization method {m} is deprecated"))
            );
            assert!(
                e.message.contains("--allow-deprecated-quantization"),
                "{e:?}"
            );
            assert!(e.fix.contains("FP8"), "{e:?}");
        }
    }
}
