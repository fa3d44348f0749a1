//! `quant_method: fp8` (vLLM's `Fp8Config`): per-tensor or block scales, static or dynamic
//! activations, and the modules it leaves unquantized, matched by exact name. Its parameters
//! (`params.rs`) are shared with compressed-tensors' FP8 scheme, and its kv-cache scales with
//! ModelOpt.

pub(crate) mod params;

use crate::layout::Experts;
use serde_json::Value;

use super::cx::{Cx, Weight};
use super::extra::{Extra, experts_module};
use super::info::{QuantInfo, activations};
use super::{
    Method, QuantError, USE_UNQUANTIZED, block_size, describe_line, refuse, refuse_dtype,
    skipped_exactly, string_list,
};
use crate::dtype::Dtype;
use crate::mapping::rules::Rules;
use params::Scales;

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Fp8 {
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
                &USE_UNQUANTIZED,
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

impl Method for Fp8 {
    fn name(&self) -> &'static str {
        "fp8"
    }

    fn describe(&self) -> String {
        let scheme = match self.block {
            Some([n, k]) => format!("FP8 block {n}×{k} (weight_scale_inv)"),
            None => "FP8 per-tensor (weight_scale)".to_string(),
        };
        describe_line(
            self.name(),
            &scheme,
            Some(self.static_activations),
            self.ignored.len(),
        )
    }

    fn supports(&self, dtype: Dtype) -> Result<(), String> {
        refuse_dtype(dtype, "fp8", "[torch.bfloat16, torch.float16]", false)
    }

    /// `Fp8Config.apply_vllm_mapper` (quantization/fp8.py:153–155): the ignored names through the
    /// model's `hf_to_vllm_mapper`, so that a VLM's checkpoint names (Qwen3.5's
    /// `model.language_model.layers.0.linear_attn.in_proj_a`) match the modules as vLLM builds
    /// them (`language_model.model.layers.0.linear_attn.in_proj_a`, a part of `in_proj_ba`). The
    /// mapper is not the stacked params mapping: a part's name stays a part's name. The listed
    /// names are kept too (wload's rules hold more than vLLM's mapper: aliases, suffixes).
    fn apply_vllm_mapper(&mut self, rules: &Rules) {
        let mapped = super::names::mapped_modules(rules, &self.ignored);
        self.ignored.extend(mapped);
    }

    /// Fp8Config's suffix renames, as regexes: wload applies suffix rules after the stacked
    /// ones, vLLM's mapper before the model's own.
    fn name_rules(&self) -> Vec<(&'static str, Option<&'static str>)> {
        vec![
            (r"\.k_proj\.output_scale$", Some(r".attn.k_scale")),
            (r"\.v_proj\.output_scale$", Some(r".attn.v_scale")),
            (r"\.q_proj\.output_scale$", Some(r".attn.q_scale")),
            (
                r"\.self_attn\.prob_output_scale$",
                Some(r".self_attn.attn.prob_scale"),
            ),
        ]
    }

    fn linear_quantized(
        &self,
        module: &str,
        shards: &[String],
    ) -> Result<bool, (String, &'static str)> {
        skipped_exactly(module, shards, |n| Ok(self.ignores(n))).map(|s| !s)
    }

    /// Block scales are cut per tuple (`layout/block_scale.rs`).
    fn plans_tuple_columns(&self) -> bool {
        self.block.is_some()
    }

    fn linear(&self, w: Weight<'_>, _cx: &mut Cx<'_>) -> Option<Vec<Extra>> {
        let scales = match self.block {
            Some(block) => Scales::Block("weight_scale_inv", block),
            None => Scales::Tensor,
        };
        params::linear(w, scales, self.static_activations)
    }

    fn experts(&self, w: Weight<'_>, _cx: &mut Cx<'_>) -> Option<Vec<Extra>> {
        let module = experts_module(w.name)?;
        // vLLM skips the experts when an ignored name containing "experts" contains them.
        let ignored = (self.ignored.iter()).any(|l| l.contains("experts") && l.contains(module));
        if !matches!(w.geometry, crate::layout::Geometry::Experts(Experts { .. })) || ignored {
            return None;
        }
        params::experts(w, self.block, self.static_activations)
    }

    fn kv_cache(&self, attention: &str, cx: &mut Cx<'_>) -> Option<Vec<Extra>> {
        Some(params::kv_scales(attention, cx.model_dtype))
    }

    fn inspect(&self) -> QuantInfo {
        QuantInfo {
            scheme: Some(if self.block.is_some() {
                "block"
            } else {
                "per-tensor"
            }),
            weight_block_size: self.block,
            activation_scheme: activations(self.static_activations),
            ignored: self.ignored.clone(),
            ..QuantInfo::of(self.name())
        }
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
        let qc = json!({"quant_method": "fp8", "activation_scheme": "dynamic",
            "weight_block_size": [128, 128], "modules_to_not_convert": ["lm_head", "model.layers.1.mlp.gate"]});
        assert_eq!(super::Fp8::parse(&qc).unwrap().block, Some([128, 128]));
        let got = q(qc).unwrap().unwrap();
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
