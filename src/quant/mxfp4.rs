//! `quant_method: mxfp4` as vLLM 0.33 reads it: on a gpt-oss model `GptOssMxfp4Config`
//! (`gpt_oss_mxfp4`, `layers/quantization/mxfp4.py:129–146`), whose experts are U8 E2M1 blocks
//! with E8M0 U8 scales and whose linear layers stay unquantized; on any other model the generic
//! `Mxfp4Config`, which wload refuses. And the MoE backends whose padding of the experts'
//! parameters `--moe-backend` reproduces (`fused_moe/oracle/mxfp4.py:837–916`).
//!
//! Its parameters (`GptOssMxfp4MoEMethod.create_weights`, `quantization/mxfp4.py:200–292`): a
//! routed experts layer becomes six zero-initialised parameters in this order: `w13_weight` U8
//! `[E, 2·I_p, H/2]`, `w13_weight_scale` U8 `[E, 2·I_p, H/32]`, `w2_weight` U8
//! `[E, H, I_p/2]`, `w2_weight_scale` U8 `[E, H, I_p/32]`, then the biases in BF16 whatever the
//! model dtype. The mapping's four bf16 expert parameters stand for the layer: its first brings
//! all six, and the planner leaves out the mapping's others (`plan/params.rs`). `I_p`, `H_p`:
//! the real slice (no `--moe-backend`), or the padding of the backend named.

use serde_json::Value;

use super::cx::{Cx, Weight};
use super::extra::Extra;
use super::info::QuantInfo;
use super::moe_backend::{MoeBackend, names};
use super::{Method, QuantError, refuse, refuse_dtype, string_list};
use crate::dtype::Dtype;
use crate::layout::mxfp4::{Mxfp4Dims, Mxfp4Part};
use crate::layout::{Geometry, GptOssExperts, Mxfp4Experts};
use crate::mapping::GptOssPart;

/// `GptOssMxfp4Config`: only the routed experts are quantized.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct GptOssMxfp4 {
    /// `modules_to_not_convert`, as the config lists it. vLLM builds every linear layer
    /// unquantized anyway (`Mxfp4Config.get_quant_method`); the list is kept for reports.
    pub not_converted: Vec<String>,
}

impl GptOssMxfp4 {
    /// `qc` of a model whose `model_type` is `model_type`: vLLM overrides `mxfp4` to
    /// `gpt_oss_mxfp4` only for `gpt_oss` (`override_quantization_method`).
    pub(super) fn parse(qc: &Value, model_type: Option<&str>) -> Result<GptOssMxfp4, QuantError> {
        if model_type != Some("gpt_oss") {
            return Err(refuse(
                format!(
                    "quantization_config.quant_method = \"mxfp4\" on model_type {}: vLLM reads it as the generic Mxfp4Config (Mxfp4MoEMethod), whose expert parameters are padded for the GPU's MoE backend and whose scales go through its own loader; wload writes MXFP4 only for gpt-oss (model_type \"gpt_oss\", GptOssMxfp4Config)",
                    model_type.map_or("(none)".to_string(), |t| format!("\"{t}\""))
                ),
                "use the model's bf16 release, or load this checkpoint with vLLM directly",
            ));
        }
        let not_converted = match qc.get("modules_to_not_convert") {
            None | Some(Value::Null) => Vec::new(),
            Some(v) => string_list(v, "modules_to_not_convert")?,
        };
        Ok(GptOssMxfp4 { not_converted })
    }
}

impl Method for GptOssMxfp4 {
    fn name(&self) -> &'static str {
        "mxfp4"
    }

    fn describe(&self) -> String {
        format!(
            "mxfp4 (gpt_oss_mxfp4): MXFP4 experts (U8 E2M1 blocks, E8M0 scales per 32), every linear layer unquantized, {} module pattern(s) listed in modules_to_not_convert",
            self.not_converted.len()
        )
    }

    /// GptOssMxfp4Config: bfloat16 only.
    fn supports(&self, dtype: Dtype) -> Result<(), String> {
        refuse_dtype(dtype, "gpt_oss_mxfp4", "[torch.bfloat16]", true)
    }

    /// `Mxfp4Config.get_quant_method`: UnquantizedLinearMethod for every linear layer.
    fn linear_quantized(&self, _: &str, _: &[String]) -> Result<bool, (String, &'static str)> {
        Ok(false)
    }

    fn moe_backend(&self, b: MoeBackend) -> Result<(), (String, String)> {
        match b.alignment() {
            Some(_) => Ok(()),
            None => Err((
                format!(
                    "--moe-backend {}: wload does not know how vLLM pads MXFP4 experts for this backend",
                    b.as_str()
                ),
                format!(
                    "name one wload pads for ({}), or leave out --moe-backend: the unpadded slices load on every backend",
                    names(MoeBackend::mxfp4())
                ),
            )),
        }
    }

    fn linear(&self, _w: Weight<'_>, _cx: &mut Cx<'_>) -> Option<Vec<Extra>> {
        None
    }

    /// `w`, the layer's `w13_weight`, made MXFP4; the layer's other five parameters after it.
    /// `None` for the mapping's other expert parameters, which the first brought already.
    fn experts(&self, w: Weight<'_>, cx: &mut Cx<'_>) -> Option<Vec<Extra>> {
        let Geometry::GptOssExperts(GptOssExperts {
            part: GptOssPart::W13Weight,
            experts,
            intermediate,
            hidden,
        }) = *w.geometry
        else {
            return None;
        };
        let base = w.name.strip_suffix("w13_weight")?.to_string();
        let dims = Mxfp4Dims {
            experts,
            intermediate,
            hidden,
            align: cx.moe_backend.and_then(|b| b.alignment()).unwrap_or([1, 1]),
        };
        let geometry = |part| Geometry::Mxfp4Experts(Mxfp4Experts { part, dims });
        *w.geometry = geometry(Mxfp4Part::W13Weight);
        *w.dtype = Dtype::U8;
        let extras = Mxfp4Part::ALL[1..].iter().map(|&part| {
            let dtype = match part {
                Mxfp4Part::W13Bias | Mxfp4Part::W2Bias => Dtype::Bf16,
                _ => Dtype::U8,
            };
            Extra::required(
                format!("{base}{}", part.param()),
                geometry(part),
                dtype,
                0.0,
            )
        });
        Some(extras.collect())
    }

    /// `Mxfp4Config.get_quant_method` gives Attention no method: no kv-cache scales.
    fn kv_cache(&self, _attention: &str, _cx: &mut Cx<'_>) -> Option<Vec<Extra>> {
        None
    }

    fn inspect(&self) -> QuantInfo {
        QuantInfo {
            scheme: Some("mxfp4 experts"),
            bits: Some(4),
            group_size: Some(32),
            weights: Some(
                "MXFP4 experts: E2M1 packed two a byte (*_blocks → w13_weight / w2_weight, U8), an E8M0 scale per 32 (*_scales); attention, router and embeddings unquantized"
                    .into(),
            ),
            ignored: self.not_converted.clone(),
            ..QuantInfo::of(self.name())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{QuantError, Quantization};
    use super::*;
    use serde_json::json;

    fn q(v: Value, model_type: &str) -> Result<Option<Quantization>, QuantError> {
        Quantization::for_model(Some(&v), Some(model_type))
    }

    #[test]
    fn mxfp4_is_gpt_oss_mxfp4_on_gpt_oss_only() {
        let qc = json!({"quant_method": "mxfp4", "modules_to_not_convert": ["lm_head"]});
        let got = q(qc.clone(), "gpt_oss").unwrap().unwrap();
        assert_eq!(got.inspect().ignored, ["lm_head"]);
        assert_eq!(got.name(), "mxfp4");
        // Linear layers are UnquantizedLinearMethod whatever the list says.
        assert!(
            !got.linear_quantized("model.layers.0.attn.qkv_proj", &[])
                .unwrap()
        );
        let err = q(qc.clone(), "deepseek_v4").unwrap_err();
        for needle in ["\"deepseek_v4\"", "Mxfp4MoEMethod", "padded", "gpt_oss"] {
            assert!(err.message.contains(needle), "{}", err.message);
        }
        assert!(err.fix.contains("bf16"), "{}", err.fix);
        // Without a model (vLLM's hf_config None) it is not gpt-oss's either.
        let err = Quantization::from_config(Some(&qc)).unwrap_err();
        assert!(err.message.contains("(none)"), "{}", err.message);
        let bad = json!({"quant_method": "mxfp4", "modules_to_not_convert": "lm_head"});
        let err = q(bad, "gpt_oss").unwrap_err();
        assert!(
            err.message.contains("modules_to_not_convert"),
            "{}",
            err.message
        );
    }
}
