//! NVIDIA ModelOpt NVFP4 (vLLM's `ModelOptNvFp4Config`, `quant_method modelopt_fp4`), read from
//! `hf_quant_config.json` (`{"producer": {"name": "modelopt"}, "quantization": {...}}`) or from
//! config.json's flat `{"quant_method": "modelopt", "quant_algo": "NVFP4", ...}`, as
//! `ModelOptQuantConfigBase.from_config` reads either (`layers/quantization/modelopt.py:313–408`),
//! and its `exclude_modules`, matched as `is_layer_excluded` matches them (l.198–236). Its
//! parameters are NVFP4's (`nvfp4.rs`) under ModelOpt's names, its kv-cache scales FP8's.

use serde_json::Value;

use super::cx::{Cx, Weight};
use super::extra::{Extra, experts_module};
use super::info::QuantInfo;
use super::moe_backend::MoeBackend;
use super::nvfp4::{self, Nvfp4Method, Nvfp4Names};
use super::{Method, QuantError, refuse, refuse_dtype, skipped_exactly, string_list};
use crate::dtype::Dtype;
use crate::mapping::rules::Rules;

/// What to do instead of a ModelOpt algorithm wload does not write.
const OTHER_MODELOPT: &str = "wload writes ModelOpt NVFP4 (quant_algo NVFP4 or W4A16_NVFP4); use that release, or the unquantized checkpoint";

/// ModelOpt's names for NVFP4's parameters (`ModelOptNvFp4LinearMethod`, `ModelOptNvFp4FusedMoE`).
const MODELOPT: Nvfp4Names = Nvfp4Names {
    method: "ModelOpt NVFP4",
    packed_suffix: "",
    global: "weight_scale_2",
    input: "input_scale",
    a16_input: true,
    backend_input_scales: true,
    k16_refusal: "Unsupported model when in features size is not multiple of 16",
    exclude_fix: "list the module in exclude_modules if the checkpoint stores it unquantized",
};

#[derive(Debug, Clone)]
pub(crate) struct ModelOptNvFp4 {
    /// NVFP4 activations too (`NVFP4`, W4A4: an `input_scale` per part) or weights only
    /// (`W4A16_NVFP4`).
    pub activations: bool,
    /// Elements per F8_E4M3 weight scale (16).
    pub group_size: u64,
    /// `exclude_modules` as vLLM holds them after `apply_vllm_mapper`: `path*` split into `path`
    /// and `path.*` (l.261–281).
    pub exclude: Vec<String>,
    /// The same entries compiled as Python's `fnmatch` reads them.
    pub(super) patterns: Vec<regex::Regex>,
}

impl ModelOptNvFp4 {
    pub(super) fn parse(qc: &Value) -> Result<ModelOptNvFp4, QuantError> {
        // The traditional hf_quant_config.json nests everything under "quantization".
        let (q, legacy) = match qc.get("quantization") {
            Some(Value::Object(_)) => (&qc["quantization"], true),
            Some(_) => {
                return Err(refuse(
                    "Expected 'quantization' to be a dictionary in config".into(),
                    "fix hf_quant_config.json: `quantization` must be an object",
                ));
            }
            None => (qc, false),
        };
        let algo = match q.get("quant_algo").and_then(Value::as_str) {
            Some(a) if !a.is_empty() => a.to_uppercase(),
            _ => {
                return Err(refuse(
                    "Missing 'quant_algo' in quantization config".into(),
                    "the ModelOpt quantization config must name its quant_algo (NVFP4)",
                ));
            }
        };
        let activations = match algo.as_str() {
            // A checkpoint that says NVFP4 but quantizes no activations loads as W4A16 (l.801–812).
            "NVFP4" => !weights_only_groups(qc),
            "W4A16_NVFP4" => false,
            "FP8" | "FP8_PER_CHANNEL_PER_TOKEN" | "FP8_PB_WO" | "MXFP8" | "MIXED_PRECISION" => {
                return Err(refuse(
                    format!(
                        "ModelOpt quant_algo \"{algo}\" is not supported: its parameters differ from NVFP4's"
                    ),
                    OTHER_MODELOPT,
                ));
            }
            _ => {
                return Err(refuse(
                    format!(
                        "ModelOpt currently only supports: ['FP8', 'FP8_PER_CHANNEL_PER_TOKEN', 'FP8_PB_WO', 'NVFP4', 'W4A16_NVFP4', 'MXFP8', 'MIXED_PRECISION'] quantizations in vLLM (quant_algo is \"{algo}\")"
                    ),
                    "check the `hf_quant_config.json` file for your model's quant configuration",
                ));
            }
        };
        if legacy {
            let missing: Vec<&str> = ["group_size", "kv_cache_quant_algo", "exclude_modules"]
                .into_iter()
                .filter(|k| q.get(*k).is_none())
                .collect();
            if !missing.is_empty() {
                return Err(refuse(
                    format!(
                        "NVFP4 quantization requires the following fields in hf_quant_config.json: {missing:?}"
                    ),
                    "add them to hf_quant_config.json (null where unused)",
                ));
            }
        }
        let group_size = match q.get("group_size") {
            None | Some(Value::Null) => 16,
            Some(v) => match v.as_u64() {
                Some(g) if g > 0 => g,
                _ => {
                    return Err(refuse(
                        format!("group_size must be an integer, got {v}"),
                        "the ModelOpt quantization config is malformed",
                    ));
                }
            },
        };
        let exclude = exclude_modules(q, legacy)?;
        let patterns = exclude.iter().map(|e| fnmatch_regex(e)).collect();
        Ok(ModelOptNvFp4 {
            activations,
            group_size,
            exclude,
            patterns,
        })
    }

    /// Whether the layer `prefix` (vLLM's name) is left unquantized: its fused parts all listed
    /// exactly (`is_layer_skipped`, decided by the caller through `exact`), an entry that is a
    /// substring of it, or an `fnmatch` pattern matching it; vision towers always.
    pub(super) fn excludes(&self, prefix: &str, exact: bool) -> bool {
        if exact {
            return true;
        }
        let unwrapped = prefix.strip_prefix("language_model.");
        let substring = self.exclude.iter().any(|e| {
            e != prefix && (prefix.contains(e.as_str()) || unwrapped.is_some_and(|u| u.contains(e)))
        });
        substring
            || self.patterns.iter().any(|p| p.is_match(prefix))
            || ["vision_tower", "vision_model", "vit_large_projector"]
                .iter()
                .any(|t| prefix.contains(t))
    }

    /// Whether `name` is listed exactly.
    pub(super) fn lists(&self, name: &str) -> bool {
        self.exclude.iter().any(|e| e == name)
    }
}

/// Whether a config.json-style ModelOpt config has config groups that all leave activations
/// unquantized.
fn weights_only_groups(qc: &Value) -> bool {
    match qc.get("config_groups").and_then(Value::as_object) {
        Some(groups) if !groups.is_empty() => groups
            .values()
            .all(|g| g.get("input_activations").is_none_or(Value::is_null)),
        _ => false,
    }
}

/// `exclude_modules` (or config.json's `ignore`), with ModelOpt's `path*` wildcard split as
/// vLLM splits it.
fn exclude_modules(q: &Value, legacy: bool) -> Result<Vec<String>, QuantError> {
    let key = if !legacy && q.get("ignore").is_some() {
        "ignore"
    } else {
        "exclude_modules"
    };
    let listed = match q.get(key) {
        None | Some(Value::Null) => Vec::new(),
        Some(v) => string_list(v, key)?,
    };
    Ok(listed
        .into_iter()
        .flat_map(|e| {
            let b = e.as_bytes();
            if b.len() >= 2 && b[b.len() - 1] == b'*' && b[b.len() - 2] != b'.' {
                let stem = e[..e.len() - 1].to_string();
                vec![stem.clone(), format!("{stem}.*")]
            } else {
                vec![e]
            }
        })
        .collect())
}

/// Python's `fnmatch.fnmatch` pattern as a regex, by `fnmatch.translate`'s rules (`*`, `?`,
/// `[seq]`, `[!seq]`, everything else literal, the whole name matched). Hand-written rather than
/// a glob crate: globs differ from fnmatch on `[` edge cases and separators, and vLLM's answer is
/// fnmatch's.
fn fnmatch_regex(pattern: &str) -> regex::Regex {
    let chars: Vec<char> = pattern.chars().collect();
    let mut out = String::from("(?s)^");
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        i += 1;
        match c {
            '*' => out.push_str(".*"),
            '?' => out.push('.'),
            '[' => {
                // A class runs to the next `]` (a `]` first in it is literal); none: a literal `[`.
                let mut j = i;
                if j < chars.len() && chars[j] == '!' {
                    j += 1;
                }
                if j < chars.len() && chars[j] == ']' {
                    j += 1;
                }
                while j < chars.len() && chars[j] != ']' {
                    j += 1;
                }
                if j >= chars.len() {
                    out.push_str(r"\[");
                    continue;
                }
                let body: String = chars[i..j].iter().collect();
                i = j + 1;
                let (neg, body) = match body.strip_prefix('!') {
                    Some(b) => (true, b.to_string()),
                    None => (false, body),
                };
                let escaped: String = body
                    .chars()
                    .map(|ch| match ch {
                        '\\' | '^' | '[' | ']' | '&' | '~' => format!("\\{ch}"),
                        other => other.to_string(),
                    })
                    .collect();
                out.push('[');
                if neg {
                    out.push('^');
                }
                out.push_str(&escaped);
                out.push(']');
            }
            other => out.push_str(&regex::escape(&other.to_string())),
        }
    }
    out.push('$');
    // Every piece above is a literal, `.`, `.*` or a class of literals: it compiles.
    regex::Regex::new(&out).unwrap_or_else(|_| {
        regex::Regex::new(&format!("^{}$", regex::escape(pattern))).expect("an escaped literal")
    })
}

impl ModelOptNvFp4 {
    fn method(&self) -> Nvfp4Method {
        Nvfp4Method::new(&MODELOPT, self.activations, self.group_size)
    }
}

impl Method for ModelOptNvFp4 {
    fn name(&self) -> &'static str {
        "modelopt_fp4"
    }

    fn describe(&self) -> String {
        format!(
            "{}: NVFP4 weights (packed E2M1, F8_E4M3 scale per {} elements, F32 global scale per part), {}, {} module pattern(s) excluded{}",
            self.name(),
            self.group_size,
            if self.activations {
                "NVFP4 activations (W4A4)"
            } else {
                "16-bit activations (W4A16)"
            },
            self.exclude.len(),
            if self.exclude.is_empty() {
                String::new()
            } else {
                format!(" ({})", self.exclude.join(", "))
            }
        )
    }

    fn supports(&self, dtype: Dtype) -> Result<(), String> {
        let list = "[torch.bfloat16, torch.float16, torch.float8_e4m3fn]";
        refuse_dtype(dtype, "modelopt_fp4", list, false)
    }

    /// `apply_vllm_mapper` (l.266–285): the entries through the model's renames (a VLM's
    /// `model.language_model.` → `language_model.model.`), the names as written kept.
    fn apply_vllm_mapper(&mut self, rules: &Rules) {
        let mapped = super::names::mapped_modules(rules, &self.exclude);
        self.patterns
            .extend(mapped.iter().map(|e| fnmatch_regex(e)));
        self.exclude.extend(mapped);
    }

    fn plans_tuple_columns(&self) -> bool {
        true
    }

    fn linear_quantized(
        &self,
        module: &str,
        shards: &[String],
    ) -> Result<bool, (String, &'static str)> {
        let exact = skipped_exactly(module, shards, |n| Ok(self.lists(n)))?;
        Ok(!self.excludes(module, exact))
    }

    fn linear(&self, w: Weight<'_>, cx: &mut Cx<'_>) -> Option<Vec<Extra>> {
        nvfp4::linear(self.method(), w, cx)
    }

    /// The NVFP4 names vLLM takes; under expert parallelism the backend sizes the experts'
    /// input scales (`nvfp4.rs`).
    fn moe_backend(&self, b: MoeBackend) -> Result<(), (String, String)> {
        nvfp4::moe_backend(b)
    }

    fn experts(&self, w: Weight<'_>, cx: &mut Cx<'_>) -> Option<Vec<Extra>> {
        let module = experts_module(w.name)?;
        if self.excludes(module, self.lists(module)) {
            return None;
        }
        nvfp4::experts(self.method(), w, cx)
    }

    fn kv_cache(&self, attention: &str, cx: &mut Cx<'_>) -> Option<Vec<Extra>> {
        Some(super::fp8::params::kv_scales(attention, cx.model_dtype))
    }

    fn inspect(&self) -> QuantInfo {
        QuantInfo {
            scheme: Some("group"),
            bits: Some(4),
            group_size: Some(self.group_size),
            weights: Some(format!(
                "NVFP4: E2M1 packed two a byte (weight U8), an F8_E4M3 scale per {} elements (weight_scale) and an F32 global scale per part (weight_scale_2)",
                self.group_size
            )),
            // W4A4 quantizes activations per group at run time, from a static global scale.
            activation_scheme: Some(if self.activations { "nvfp4" } else { "none" }.into()),
            ignored: self.exclude.clone(),
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

    fn legacy(algo: &str, exclude: Value) -> Value {
        json!({"producer": {"name": "modelopt", "version": "0.23.0"},
               "quantization": {"quant_algo": algo, "kv_cache_quant_algo": null,
                                "group_size": 16, "exclude_modules": exclude}})
    }

    #[test]
    fn both_config_spellings_read_as_vllm_reads_them() {
        assert!(q(legacy("nvfp4", json!(["lm_head"]))).unwrap().is_some());
        let m = ModelOptNvFp4::parse(&legacy("nvfp4", json!(["lm_head"]))).unwrap();
        assert!(m.activations && m.group_size == 16 && m.exclude == ["lm_head"]);
        let flat = json!({"quant_method": "modelopt", "quant_algo": "NVFP4",
            "ignore": ["lm_head", "model.layers.0.mlp*"],
            "config_groups": {"g": {"weights": {"num_bits": 4}, "input_activations": null}}});
        assert_eq!(q(flat.clone()).unwrap().unwrap().name(), "modelopt_fp4");
        let m = ModelOptNvFp4::parse(&flat).unwrap();
        assert!(!m.activations, "no activation groups: W4A16");
        assert_eq!(
            m.exclude,
            ["lm_head", "model.layers.0.mlp", "model.layers.0.mlp.*"]
        );
    }

    #[test]
    fn exclusions_match_exactly_by_substring_and_by_fnmatch() {
        let m = ModelOptNvFp4::parse(&legacy(
            "NVFP4",
            json!([
                "lm_head",
                "model.layers.1.self_attn",
                "*.mlp.gate",
                "model.layers.[!0].x?"
            ]),
        ))
        .unwrap();
        assert!(m.excludes("model.layers.1.self_attn.qkv_proj", false));
        assert!(!m.excludes("model.layers.0.self_attn.qkv_proj", false));
        assert!(m.excludes("model.layers.3.mlp.gate", false));
        assert!(m.excludes("model.layers.3.xy", false));
        assert!(!m.excludes("model.layers.0.xy", false));
        assert!(m.excludes("visual.vision_tower.blocks.0.qkv", false));
    }

    #[test]
    fn other_modelopt_algorithms_and_missing_fields_are_refused_by_name() {
        for (cfg, needle) in [
            (legacy("FP8", json!([])), "\"FP8\" is not supported"),
            (
                legacy("INT4_AWQ", json!([])),
                "ModelOpt currently only supports",
            ),
            (
                json!({"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4"}}),
                "requires the following fields in hf_quant_config.json",
            ),
            (
                json!({"producer": {"name": "modelopt"}, "quantization": {}}),
                "Missing 'quant_algo'",
            ),
        ] {
            let e = q(cfg).unwrap_err();
            assert!(e.message.contains(needle), "{}", e.message);
            assert!(!e.fix.is_empty());
        }
    }
}
