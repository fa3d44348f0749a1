//! `quant_method: gptq` (also `gptq_marlin`, `marlin`): vLLM 0.33's `AutoGPTQConfig`
//! (`layers/quantization/auto_gptq.py`): bits, groups, `desc_act`, symmetry, and the modules it
//! quantizes — `modules_in_block_to_quantize` when the config lists them, else every module with
//! an integer tensor in the checkpoint (`maybe_update_config`). Its parameters (`params.rs`)
//! are shared with AWQ; an output's config must list its quantized modules (`output_config.rs`).

mod output_config;
pub(crate) mod params;

use serde_json::Value;

use super::cx::{Cx, Weight};
use super::extra::{Extra, experts_module};
use super::info::QuantInfo;
use super::{Method, QuantError, Written, refuse, refuse_dtype};
use crate::dtype::Dtype;
use crate::mapping::rules::Rules;
use params::IntScheme;

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Gptq {
    /// 4 or 8 (`TYPE_MAP`: `uint4b8`, `uint8b128`).
    pub bits: u64,
    /// `group_size`; `None` for -1 (one group per output channel).
    pub group: Option<u64>,
    /// `desc_act` as vLLM normalises it (false with channelwise groups).
    pub desc_act: bool,
    /// `modules_in_block_to_quantize` as the config writes it (groups of names), if it does.
    pub listed: Option<Vec<Vec<String>>>,
    /// The names vLLM matches layer prefixes against (substrings): the flattened list, or
    /// the checkpoint's modules with an integer tensor ([`Gptq::update_from_checkpoint`]).
    pub quantized: Vec<String>,
}

/// The refusal fix for a GPTQ variant vLLM 0.33 cannot load.
const OTHER_RELEASE: &str = "use a GPTQ release vLLM 0.33 loads (symmetric 4- or 8-bit, desc_act false or channelwise), or the unquantized checkpoint";

impl Gptq {
    pub(super) fn parse(qc: &Value) -> Result<Gptq, QuantError> {
        let int = |k: &str| -> Result<i64, QuantError> {
            qc.get(k).and_then(Value::as_i64).ok_or_else(|| {
                refuse(
                    format!("Cannot find any of ['{k}'] in the model's quantization config (gptq)"),
                    "quantization_config is malformed: GPTQ needs bits, group_size, desc_act and sym",
                )
            })
        };
        let flag = |k: &str| -> Result<bool, QuantError> {
            qc.get(k).and_then(Value::as_bool).ok_or_else(|| {
                refuse(
                    format!("Cannot find any of ['{k}'] in the model's quantization config (gptq)"),
                    "quantization_config is malformed: GPTQ needs bits, group_size, desc_act and sym",
                )
            })
        };
        let bits = int("bits")?;
        let group_size = int("group_size")?;
        let desc_act = flag("desc_act")? && group_size != -1;
        let sym = flag("sym")?;
        if desc_act {
            return Err(refuse(
                "GPTQ group activation ordering (desc_act=True) is no longer supported. Use a checkpoint with static activation ordering or desc_act=False.".into(),
                OTHER_RELEASE,
            ));
        }
        if !(matches!(bits, 4 | 8) && sym) {
            let py = if sym { "True" } else { "False" };
            return Err(refuse(
                format!("Unsupported quantization config: bits={bits}, sym={py}"),
                OTHER_RELEASE,
            ));
        }
        let group = match group_size {
            -1 => None,
            g if g > 0 => Some(g as u64),
            g => {
                return Err(refuse(
                    format!("quantization_config.group_size must be positive or -1, got {g}"),
                    "quantization_config is malformed",
                ));
            }
        };
        let dynamic = qc.get("dynamic").and_then(Value::as_object);
        if dynamic.is_some_and(|d| !d.is_empty()) {
            return Err(refuse(
                "quantization_config.dynamic (GPTQModel per-module overrides) is not supported by wload: the layers it changes would get other bits, groups or no quantization".into(),
                "use a GPTQ release without `dynamic` rules",
            ));
        }
        if qc.get("lm_head").and_then(Value::as_bool) == Some(true) {
            return Err(refuse(
                "quantization_config.lm_head = true (a GPTQ-quantized lm_head) is not supported by wload".into(),
                "use a GPTQ release whose lm_head is unquantized",
            ));
        }
        let listed = listed_modules(qc.get("modules_in_block_to_quantize"))?;
        let quantized = listed.iter().flatten().flatten().cloned().collect();
        Ok(Gptq {
            bits: bits as u64,
            group,
            desc_act,
            listed,
            quantized,
        })
    }

    /// `maybe_update_config`: without a listed module, every checkpoint module (a tensor name
    /// without its last part) that has a tensor of a type other than F16, BF16 and F32.
    pub(super) fn read_checkpoint<'a>(&mut self, tensors: impl Iterator<Item = (&'a str, Dtype)>) {
        if !self.quantized.is_empty() {
            return;
        }
        let mut found: Vec<String> = tensors
            .filter(|(_, d)| !matches!(d, Dtype::F16 | Dtype::Bf16 | Dtype::F32))
            .filter_map(|(n, _)| n.rsplit_once('.').map(|(m, _)| m.to_string()))
            .collect();
        found.sort();
        found.dedup();
        self.quantized = found;
    }

    /// `is_layer_gptq_quantized`: whether a listed name is inside the layer's prefix (each
    /// shard's, for a fused layer, and all must agree). An empty list quantizes everything.
    pub(super) fn quantizes(
        &self,
        module: &str,
        shards: &[String],
    ) -> Result<bool, (String, &'static str)> {
        if self.quantized.is_empty() {
            return Ok(true);
        }
        let inside = |prefix: &str| Ok(self.quantized.iter().any(|l| prefix.contains(l.as_str())));
        super::by_parts(
            module,
            shards,
            false,
            inside,
            "quantize every part of the fused layer, or none",
        )
    }
}

impl Method for Gptq {
    fn name(&self) -> &'static str {
        "gptq"
    }

    fn describe(&self) -> String {
        let group = self
            .group
            .map_or("channelwise".into(), |g| format!("group size {g}"));
        let modules = match &self.listed {
            Some(l) => format!("{} listed module group(s) quantized", l.len()),
            None => format!(
                "{} checkpoint module(s) with integer tensors quantized",
                self.quantized.len()
            ),
        };
        format!(
            "gptq: INT{} (qweight/scales/qzeros), {group}, desc_act {}, symmetric, {modules}",
            self.bits, self.desc_act
        )
    }

    fn supports(&self, dtype: Dtype) -> Result<(), String> {
        refuse_dtype(dtype, "auto_gptq", "[torch.float16, torch.bfloat16]", false)
    }

    fn update_from_checkpoint(
        &mut self,
        tensors: &mut dyn Iterator<Item = (&str, Dtype)>,
    ) -> Result<(), QuantError> {
        self.read_checkpoint(tensors);
        Ok(())
    }

    /// `apply_vllm_mapper`: the list through the model's renames (a VLM's
    /// `model.language_model.` → `language_model.model.`), the names as written kept.
    fn apply_vllm_mapper(&mut self, rules: &Rules) {
        let mapped = super::names::mapped_modules(rules, &self.quantized);
        self.quantized.extend(mapped);
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
        self.quantizes(module, shards)
    }

    fn linear(&self, w: Weight<'_>, cx: &mut Cx<'_>) -> Option<Vec<Extra>> {
        params::linear(self.scheme(), w, cx)
    }

    /// AutoGPTQConfig quantizes every RoutedExperts (only `dynamic` rules, refused, skip).
    fn experts(&self, w: Weight<'_>, cx: &mut Cx<'_>) -> Option<Vec<Extra>> {
        experts_module(w.name)?;
        params::experts(self.scheme(), w, cx)
    }

    /// No kv-cache method: the Attention layer keeps only its scale buffers.
    fn kv_cache(&self, _attention: &str, _cx: &mut Cx<'_>) -> Option<Vec<Extra>> {
        None
    }

    fn inspect(&self) -> QuantInfo {
        QuantInfo {
            scheme: Some(if self.group.is_some() {
                "group"
            } else {
                "per-channel"
            }),
            bits: Some(self.bits),
            group_size: self.group,
            symmetric: Some(true),
            weights: Some(format!(
                "INT{} packed 8/int32 on the input dim (qweight, scales, qzeros), {}, desc_act {}, symmetric{}",
                self.bits,
                self.group
                    .map_or("one group per output channel".into(), |n| format!(
                        "groups of {n}"
                    )),
                self.desc_act,
                if self.listed.is_some() {
                    ", quantized modules listed (modules_in_block_to_quantize)"
                } else {
                    ", quantized modules: those with integer tensors in the checkpoint"
                }
            )),
            ..QuantInfo::of(self.name())
        }
    }

    fn output_config(&self, qc: &mut Value, written: &dyn Fn() -> Vec<Written>) -> Option<String> {
        output_config::add_quantized_modules(qc, written)
    }
}

impl Gptq {
    fn scheme(&self) -> IntScheme {
        IntScheme {
            gptq: true,
            bits: self.bits,
            group: self.group,
        }
    }
}

/// `modules_in_block_to_quantize`: a list of names, or of lists of names.
fn listed_modules(v: Option<&Value>) -> Result<Option<Vec<Vec<String>>>, QuantError> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let bad = || {
        refuse(
            format!(
                "quantization_config.modules_in_block_to_quantize must be a list of names or of lists of names, got {v}"
            ),
            "quantization_config is malformed",
        )
    };
    let strings = |a: &Value| -> Option<Vec<String>> {
        match a {
            Value::String(s) => Some(vec![s.clone()]),
            Value::Array(items) => items
                .iter()
                .map(|s| s.as_str().map(str::to_string))
                .collect(),
            _ => None,
        }
    };
    let groups = v.as_array().ok_or_else(bad)?;
    let out = groups
        .iter()
        .map(strings)
        .collect::<Option<Vec<_>>>()
        .ok_or_else(bad)?;
    Ok((!out.is_empty()).then_some(out))
}

#[cfg(test)]
mod tests {
    use super::super::{QuantError, Quantization};
    use super::*;
    use serde_json::json;

    fn q(v: Value) -> Result<Option<Quantization>, QuantError> {
        Quantization::from_config(Some(&v))
    }

    fn base() -> Value {
        json!({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": false, "sym": true})
    }

    #[test]
    fn gptq_refusals_use_vllms_words_and_say_what_to_use() {
        let with = |k: &str, v: Value| {
            let mut c = base();
            c[k] = v;
            q(c).unwrap_err()
        };
        let e = with("desc_act", json!(true));
        assert!(
            e.message.contains("desc_act=True) is no longer supported"),
            "{e:?}"
        );
        assert!(e.fix.contains("desc_act false"), "{e:?}");
        let e = with("sym", json!(false));
        assert_eq!(
            e.message,
            "Unsupported quantization config: bits=4, sym=False"
        );
        assert!(e.fix.contains("symmetric"), "{e:?}");
        let e = with("bits", json!(3));
        assert_eq!(
            e.message,
            "Unsupported quantization config: bits=3, sym=True"
        );
        assert!(with("lm_head", json!(true)).message.contains("lm_head"));
        assert!(
            with("dynamic", json!({"-:.*mlp.*": {}}))
                .message
                .contains("dynamic")
        );
        // desc_act with one group per channel is a no-op vLLM accepts.
        let mut c = base();
        c["desc_act"] = json!(true);
        c["group_size"] = json!(-1);
        assert!(q(c).unwrap().is_some());
    }

    #[test]
    fn quantized_layers_come_from_the_list_or_the_checkpoints_integer_tensors() {
        let mut c = base();
        c["modules_in_block_to_quantize"] = json!([
            ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
            ["mlp.down_proj"]
        ]);
        let g = Gptq::parse(&c).unwrap();
        let qkv = ["q_proj", "k_proj", "v_proj"].map(String::from);
        assert_eq!(
            g.quantizes("model.layers.3.self_attn.qkv_proj", &qkv),
            Ok(true)
        );
        assert_eq!(
            g.quantizes("model.layers.3.self_attn.o_proj", &[]),
            Ok(false)
        );
        let mut g = Gptq::parse(&base()).unwrap();
        g.read_checkpoint(
            [
                ("model.layers.0.self_attn.q_proj.qweight", Dtype::I32),
                ("model.layers.0.self_attn.q_proj.scales", Dtype::F16),
                ("model.layers.0.self_attn.k_proj.qweight", Dtype::I32),
                ("model.layers.0.self_attn.v_proj.weight", Dtype::F16),
            ]
            .into_iter(),
        );
        let err = g
            .quantizes("model.layers.0.self_attn.qkv_proj", &qkv)
            .unwrap_err();
        assert!(err.0.contains("not all shards"), "{err:?}");
    }
}
