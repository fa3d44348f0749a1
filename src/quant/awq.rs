//! `quant_method: awq`: vLLM 0.33's `AutoAWQConfig` (`layers/quantization/auto_awq.py`): 4-bit
//! weights in groups with zero points, and the modules it leaves unconverted —
//! `modules_to_not_convert` when the config lists them, else every checkpoint module without an
//! integer tensor (`maybe_update_config`), matched as substrings of a layer's name. Its
//! parameters are GPTQ's packed ones with the output packed (`gptq/params.rs`).

use serde_json::Value;

use super::cx::{Cx, Weight};
use super::extra::{Extra, experts_module};
use super::gptq::params::{self, IntScheme};
use super::info::QuantInfo;
use super::{Method, QuantError, refuse, refuse_dtype, string_list};
use crate::dtype::Dtype;
use crate::mapping::rules::Rules;

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Awq {
    /// `w_bit` / `bits`: 4 (`TYPE_MAP`).
    pub bits: u64,
    /// `q_group_size` / `group_size`.
    pub group: u64,
    /// `zero_point`.
    pub zero_point: bool,
    /// `modules_to_not_convert` as the config writes it, or derived from the checkpoint.
    pub not_converted: Vec<String>,
}

impl Awq {
    pub(super) fn parse(qc: &Value) -> Result<Awq, QuantError> {
        let any = |keys: &[&str]| -> Result<&Value, QuantError> {
            keys.iter().find_map(|k| qc.get(*k)).ok_or_else(|| {
                refuse(
                    format!("Cannot find any of {keys:?} in the model's quantization config (awq)"),
                    "quantization_config is malformed: AWQ needs w_bit (or bits), q_group_size (or group_size) and zero_point",
                )
            })
        };
        let bits = any(&["w_bit", "bits"])?.as_i64().unwrap_or(0);
        if bits != 4 {
            return Err(refuse(
                format!(
                    "Unsupported num_bits = {bits}. Supported: 4. For 8-bit AWQ, use Marlin backend by setting backend='awq:marlin' or backend='marlin'."
                ),
                "vLLM 0.33 loads 4-bit AWQ only: use a 4-bit AWQ release, a GPTQ 8-bit one, or the unquantized checkpoint",
            ));
        }
        let group = match any(&["q_group_size", "group_size"])?.as_i64() {
            Some(g) if g > 0 => g as u64,
            g => {
                return Err(refuse(
                    format!(
                        "AWQ group size {} is not supported by wload: with group_size -1 vLLM gives a row-parallel layer's rank K/tp // K groups",
                        g.map_or("(missing)".into(), |g| g.to_string())
                    ),
                    "use an AWQ release with groups (q_group_size 32, 64 or 128)",
                ));
            }
        };
        let zero_point = any(&["zero_point"])?.as_bool().unwrap_or(false);
        if qc.get("lm_head").and_then(Value::as_bool) == Some(true) {
            return Err(refuse(
                "quantization_config.lm_head = true (an AWQ-quantized lm_head) is not supported by wload".into(),
                "use an AWQ release whose lm_head is unquantized",
            ));
        }
        let not_converted = match qc.get("modules_to_not_convert") {
            None | Some(Value::Null) => Vec::new(),
            Some(v) => string_list(v, "modules_to_not_convert")?,
        };
        Ok(Awq {
            bits: bits as u64,
            group,
            zero_point,
            not_converted,
        })
    }

    /// `maybe_update_config`: without listed modules, every checkpoint module none of whose
    /// tensors is of a type other than F16, BF16 and F32. Refused when such a module holds a
    /// quantized one (a GDN layer's `linear_attn` owns the float `A_log` and `dt_bias`): AWQ
    /// matches the list as substrings, so vLLM builds the quantized layers under it unquantized
    /// and fails loading their `qweight`.
    pub(super) fn read_checkpoint<'a>(
        &mut self,
        tensors: impl Iterator<Item = (&'a str, Dtype)>,
    ) -> Result<(), QuantError> {
        if !self.not_converted.is_empty() {
            return Ok(());
        }
        let mut modules: std::collections::BTreeMap<String, bool> = Default::default();
        for (name, dtype) in tensors {
            let Some((module, _)) = name.rsplit_once('.') else {
                continue;
            };
            let quantized = !matches!(dtype, Dtype::F16 | Dtype::Bf16 | Dtype::F32);
            *modules.entry(module.to_string()).or_default() |= quantized;
        }
        let (quantized, float): (Vec<_>, Vec<_>) = modules.into_iter().partition(|(_, q)| *q);
        self.not_converted = float.into_iter().map(|(m, _)| m).collect();
        let holds = |q: &str| {
            (self.not_converted.iter())
                .find(|m| q.starts_with(m.as_str()) && q[m.len()..].starts_with('.'))
        };
        match quantized.iter().find_map(|(q, _)| holds(q).map(|m| (q, m))) {
            Some((q, m)) => Err(parent_not_converted(q, m)),
            None => Ok(()),
        }
    }

    /// `is_layer_skipped(..., match_mode="substring")`: a listed name inside the layer's
    /// prefix, or inside each shard's (all must agree).
    pub(super) fn skips(
        &self,
        module: &str,
        shards: &[String],
    ) -> Result<bool, (String, &'static str)> {
        let inside = |p: &str| Ok(self.not_converted.iter().any(|l| p.contains(l.as_str())));
        super::by_parts(
            module,
            shards,
            true,
            inside,
            "list every part of the fused layer in modules_to_not_convert, or none",
        )
    }
}

/// vLLM's failure when the derived `modules_to_not_convert` holds `parent`, a float-only module
/// above the quantized `module` (`auto_awq.py:379–388` derives it, `:294–300` matches it as a
/// substring; the AWQ `qweight` then meets an unquantized layer, `linear.py:780` from `:1000`).
fn parent_not_converted(module: &str, parent: &str) -> QuantError {
    refuse(
        format!(
            "AttributeError: 'MergedColumnParallelLinear' object has no attribute 'data' (vLLM 0.33 fails loading this AWQ checkpoint: quantization_config.modules_to_not_convert is null, so vLLM lists every checkpoint module without an integer tensor, among them `{parent}` (its own tensors are float), and matches the list as substrings: `{module}` under it is built unquantized, then receives its qweight)"
        ),
        "write the unquantized modules into quantization_config.modules_to_not_convert (a Qwen3.5 / Qwen3-Next AutoAWQ checkpoint: [\"visual\", \"linear_attn.in_proj_b\", \"linear_attn.in_proj_a\"] and whatever else it keeps in float, e.g. \"mlp.gate\", \"shared_expert_gate\"), or use the unquantized checkpoint",
    )
}

impl Awq {
    fn scheme(&self) -> IntScheme {
        IntScheme {
            gptq: false,
            bits: self.bits,
            group: Some(self.group),
        }
    }
}

impl Method for Awq {
    fn name(&self) -> &'static str {
        "awq"
    }

    fn describe(&self) -> String {
        format!(
            "awq: INT{} (qweight/qzeros/scales), group size {}, zero points {}, {} module(s) not converted",
            self.bits,
            self.group,
            if self.zero_point { "on" } else { "off" },
            self.not_converted.len()
        )
    }

    fn supports(&self, dtype: Dtype) -> Result<(), String> {
        refuse_dtype(dtype, "auto_awq", "[torch.float16, torch.bfloat16]", false)
    }

    fn update_from_checkpoint(
        &mut self,
        tensors: &mut dyn Iterator<Item = (&str, Dtype)>,
    ) -> Result<(), QuantError> {
        self.read_checkpoint(tensors)
    }

    /// `apply_vllm_mapper`: the list through the model's renames (a VLM's
    /// `model.language_model.` → `language_model.model.`), the names as written kept.
    fn apply_vllm_mapper(&mut self, rules: &Rules) {
        let mapped = super::names::mapped_modules(rules, &self.not_converted);
        self.not_converted.extend(mapped);
    }

    fn marlin_int_config(&self) -> bool {
        true
    }

    fn plans_tuple_columns(&self) -> bool {
        true
    }

    fn linear_quantized(
        &self,
        module: &str,
        shards: &[String],
    ) -> Result<bool, (String, &'static str)> {
        self.skips(module, shards).map(|s| !s)
    }

    fn linear(&self, w: Weight<'_>, cx: &mut Cx<'_>) -> Option<Vec<Extra>> {
        params::linear(self.scheme(), w, cx)
    }

    fn experts(&self, w: Weight<'_>, cx: &mut Cx<'_>) -> Option<Vec<Extra>> {
        let module = experts_module(w.name)?;
        if self.skips(module, &[]).unwrap_or(true) {
            return None;
        }
        params::experts(self.scheme(), w, cx)
    }

    /// No kv-cache method: the Attention layer keeps only its scale buffers.
    fn kv_cache(&self, _attention: &str, _cx: &mut Cx<'_>) -> Option<Vec<Extra>> {
        None
    }

    fn inspect(&self) -> QuantInfo {
        QuantInfo {
            scheme: Some("group"),
            bits: Some(self.bits),
            group_size: Some(self.group),
            symmetric: Some(!self.zero_point),
            weights: Some(format!(
                "INT{} packed 8/int32 on the output dim (qweight, qzeros, scales), groups of {}, zero points {}",
                self.bits,
                self.group,
                if self.zero_point { "on" } else { "off" }
            )),
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

    fn q(v: Value) -> Result<Option<Quantization>, QuantError> {
        Quantization::from_config(Some(&v))
    }

    #[test]
    fn awq_other_than_4_bits_is_refused_in_vllms_words() {
        let e = q(json!({"quant_method": "awq", "bits": 8, "group_size": 128, "zero_point": true}))
            .unwrap_err();
        assert!(
            e.message
                .starts_with("Unsupported num_bits = 8. Supported: 4."),
            "{e:?}"
        );
        assert!(e.fix.contains("4-bit AWQ"), "{e:?}");
    }

    #[test]
    fn unconverted_modules_are_the_checkpoints_float_only_modules() {
        let mut a = Awq::parse(
            &json!({"quant_method": "awq", "w_bit": 4, "q_group_size": 32, "zero_point": true}),
        )
        .unwrap();
        let derived = a.read_checkpoint(
            [
                ("model.layers.0.self_attn.q_proj.qweight", Dtype::I32),
                ("model.layers.0.self_attn.q_proj.scales", Dtype::F16),
                ("model.layers.0.self_attn.q_proj.bias", Dtype::F16),
                ("model.layers.0.mlp.down_proj.weight", Dtype::F16),
                ("model.layers.0.input_layernorm.weight", Dtype::F16),
            ]
            .into_iter(),
        );
        assert_eq!(derived, Ok(()));
        assert_eq!(
            a.not_converted,
            [
                "model.layers.0.input_layernorm",
                "model.layers.0.mlp.down_proj"
            ]
        );
        assert_eq!(a.skips("model.layers.0.mlp.down_proj", &[]), Ok(true));
        assert_eq!(a.skips("model.layers.0.self_attn.q_proj", &[]), Ok(false));
    }
}
