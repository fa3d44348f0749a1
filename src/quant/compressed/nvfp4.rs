//! `format: nvfp4-pack-quantized` (vLLM's `CompressedTensorsW4A4Fp4` for linears,
//! `CompressedTensorsW4A4Nvfp4MoEMethod` for experts): E2M1 weights packed two a byte, an
//! F8_E4M3 scale per 16 input columns and an F32 global scale per part; W4A4 adds an F32 input
//! global scale per part, W4A16 (no `input_activations`) has none.

use serde_json::Value;

use super::super::nvfp4::Nvfp4Names;
use super::super::{QuantError, USE_UNQUANTIZED, field, refuse};

/// compressed-tensors' names for NVFP4's parameters (`nvfp4.rs`).
pub(super) const COMPRESSED: Nvfp4Names = Nvfp4Names {
    method: "compressed-tensors NVFP4",
    packed_suffix: "_packed",
    global: "weight_global_scale",
    input: "input_global_scale",
    a16_input: false,
    backend_input_scales: false,
    // vLLM sizes the scales `K_r // 16` without a check: the checkpoint's would load misaligned.
    k16_refusal: "an NVFP4 scale covers 16 input columns, so a rank's input must be whole groups of 16 (vLLM would size weight_scale by rounding down and load misaligned scales)",
    exclude_fix: "list the module in quantization_config.ignore if the checkpoint stores it unquantized",
};

/// NVFP4 weights, with NVFP4 activations (W4A4) or 16-bit ones (W4A16).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Nvfp4 {
    /// `input_activations` are NVFP4 too: an `input_global_scale` per part.
    pub activations: bool,
}

impl Nvfp4 {
    /// Elements per F8_E4M3 scale: vLLM's scheme fixes it (`self.group_size = 16`).
    pub(crate) const GROUP: u64 = 16;

    pub(super) fn parse(group: &Value, at: &dyn Fn(&str) -> String) -> Result<Self, QuantError> {
        let w = super::weights_of(group, at)?;
        if !is_nvfp4(w) {
            return Err(refuse(
                format!(
                    "No compressed-tensors compatible scheme was found for {}: nvfp4-pack-quantized weights must be NVFP4 (type float, num_bits 4, strategy tensor_group, group_size 16, symmetric), found type {}, num_bits {}, strategy {}, group_size {}, symmetric {}",
                    at("weights"),
                    field(w, "type"),
                    field(w, "num_bits"),
                    field(w, "strategy"),
                    field(w, "group_size"),
                    field(w, "symmetric"),
                ),
                "the quantization_config does not describe an NVFP4 checkpoint: check config_groups against the checkpoint, or use the unquantized checkpoint",
            ));
        }
        let activations = match group.get("input_activations") {
            None | Some(Value::Null) => false,
            Some(a) if is_nvfp4(a) => true,
            Some(a) => {
                return Err(refuse(
                    format!(
                        "For NVFP4 weights, input quantization must also be NVFP4 format, None for NVFP4A16 ({} is type {}, num_bits {}, strategy {}, group_size {})",
                        at("input_activations"),
                        field(a, "type"),
                        field(a, "num_bits"),
                        field(a, "strategy"),
                        field(a, "group_size"),
                    ),
                    &USE_UNQUANTIZED,
                ));
            }
        };
        Ok(Nvfp4 { activations })
    }

    /// `NVFP4 (W4A4)`, for reports.
    pub(crate) fn describe(&self) -> String {
        format!(
            "NVFP4 weights (packed E2M1, F8_E4M3 scale per {}, F32 global scale per part), {}",
            Self::GROUP,
            if self.activations {
                "NVFP4 activations (W4A4)"
            } else {
                "16-bit activations (W4A16)"
            }
        )
    }
}

/// vLLM's `_is_nvfp4_format` (compressed_tensors.py:420–437): 4-bit symmetric floats in
/// tensor-group scales of 16. `symmetric` defaults to true in compressed-tensors' arguments.
fn is_nvfp4(args: &Value) -> bool {
    field(args, "strategy") == "tensor_group"
        && field(args, "type") == "float"
        && field(args, "num_bits") == 4
        && field(args, "group_size") == 16
        && field(args, "symmetric") != false
}

#[cfg(test)]
mod tests {
    use super::super::Scheme;
    use super::Nvfp4;
    use serde_json::{Value, json};

    fn nvfp4(edit: impl FnOnce(&mut Value)) -> Result<Nvfp4, String> {
        let args = json!({"num_bits": 4, "type": "float", "strategy": "tensor_group",
                          "group_size": 16, "symmetric": true, "dynamic": false});
        let mut input = args.clone();
        input["dynamic"] = json!("local");
        let mut qc = json!({"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": args,
                                          "input_activations": input}}});
        edit(&mut qc["config_groups"]["group_0"]);
        match super::super::Compressed::parse(&qc) {
            Ok(c) => match c.scheme {
                Scheme::Nvfp4(n) => Ok(n),
                other => panic!("{other:?}"),
            },
            Err(e) => Err(format!("{} / {}", e.message, e.fix)),
        }
    }

    /// `_is_nvfp4_format` on weights and activations picks W4A4, W4A16 or a refusal.
    #[test]
    fn the_scheme_is_chosen_as_vllm_chooses_it() {
        assert_eq!(nvfp4(|_| {}), Ok(Nvfp4 { activations: true }));
        assert_eq!(
            nvfp4(|g| g["input_activations"] = Value::Null),
            Ok(Nvfp4 { activations: false })
        );
        let e = nvfp4(|g| g["input_activations"]["num_bits"] = json!(8)).unwrap_err();
        assert!(e.contains("input quantization must also be NVFP4"), "{e}");
        for (k, v) in [("symmetric", json!(false)), ("group_size", json!(32))] {
            let e = nvfp4(|g| g["weights"][k] = v.clone()).unwrap_err();
            assert!(e.contains("No compressed-tensors compatible scheme"), "{e}");
        }
    }
}
