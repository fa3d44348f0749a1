//! `quant_method: fp8` (vLLM's `Fp8Config`): per-tensor or block scales, static or dynamic
//! activations, and the modules it leaves unquantized, matched by exact name.

use serde_json::Value;

use super::{QuantError, USE_UNQUANTIZED, block_size, refuse, string_list};

#[derive(Debug, Clone, PartialEq)]
pub struct Fp8 {
    /// `weight_block_size` `[block_n, block_k]`: block scales (`weight_scale_inv`); none:
    /// per-tensor scales (`weight_scale`).
    pub block: Option<[u64; 2]>,
    /// `activation_scheme: static`: an `input_scale` per linear layer.
    pub static_activations: bool,
    /// `ignored_layers`, else `modules_to_not_convert`: module names kept unquantized, matched
    /// exactly (vLLM's `ignored_layers_match_mode = "exact"`).
    pub ignored: Vec<String>,
}

impl Fp8 {
    pub(super) fn parse(qc: &Value) -> Result<Fp8, QuantError> {
        let scheme = match qc.get("activation_scheme").and_then(Value::as_str) {
            Some(s @ ("static" | "dynamic")) => s,
            Some(other) => {
                return Err(refuse(
                    format!(
                        "Unsupported activation scheme {other} (quantization_config.activation_scheme)"
                    ),
                    "vLLM accepts \"static\" or \"dynamic\"",
                ));
            }
            None => {
                return Err(refuse(
                    "quantization_config (fp8) has no activation_scheme, which vLLM requires"
                        .into(),
                    "add \"activation_scheme\": \"dynamic\" (or \"static\" when the checkpoint has input_scale tensors)",
                ));
            }
        };
        if qc.get("store_dtype").and_then(Value::as_str) == Some("mxfp4") {
            return Err(refuse(
                "quantization_config (fp8) has store_dtype \"mxfp4\": MXFP4 experts are not supported".into(),
                USE_UNQUANTIZED,
            ));
        }
        let block = match qc.get("weight_block_size") {
            None | Some(Value::Null) => None,
            Some(v) => Some(block_size(v, "weight_block_size")?),
        };
        if block.is_some() && scheme != "dynamic" {
            return Err(refuse(
                format!(
                    "The block-wise quantization only supports dynamic activation scheme for now, but got {scheme} activation scheme."
                ),
                "block FP8 checkpoints use \"activation_scheme\": \"dynamic\"",
            ));
        }
        let names = |key: &str| -> Result<Vec<String>, QuantError> {
            match qc.get(key) {
                None | Some(Value::Null) => Ok(Vec::new()),
                Some(v) => string_list(v, key),
            }
        };
        let mut ignored = names("ignored_layers")?;
        if ignored.is_empty() {
            ignored = names("modules_to_not_convert")?;
        }
        Ok(Fp8 {
            block,
            static_activations: scheme == "static",
            ignored,
        })
    }

    /// Whether the module `name` is listed as left unquantized.
    pub(super) fn ignores(&self, name: &str) -> bool {
        self.ignored.iter().any(|l| l == name)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{QuantError, Quantization};
    use serde_json::{Value, json};

    fn q(v: Value) -> Result<Option<Quantization>, QuantError> {
        Quantization::from_config(Some(&v))
    }

    #[test]
    fn fp8_block_and_ignored_modules_are_read_as_vllm_reads_them() {
        let got = q(json!({"quant_method": "fp8", "activation_scheme": "dynamic",
            "weight_block_size": [128, 128], "modules_to_not_convert": ["lm_head", "model.layers.1.mlp.gate"]}))
        .unwrap()
        .unwrap();
        let Quantization::Fp8(f) = &got else { panic!() };
        assert_eq!(f.block, Some([128, 128]));
        assert!(
            !got.linear_quantized("model.layers.1.mlp.gate", &[])
                .unwrap()
        );
        assert!(
            got.linear_quantized("model.layers.0.mlp.gate", &[])
                .unwrap()
        );
    }
}
