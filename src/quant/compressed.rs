//! `quant_method: compressed-tensors` with FP8 weights (vLLM's `CompressedTensorsW8A8Fp8`): the
//! one config group read as vLLM reads it (per-tensor, per-channel or block weight scales, static
//! or dynamic activations), and the `ignore` list, whose `re:` entries are Python regexes.

use serde_json::Value;

use super::{QuantError, USE_UNQUANTIZED, block_size, field, refuse, string_list};

#[derive(Debug, Clone)]
pub struct CompressedFp8 {
    pub weights: WeightStrategy,
    /// Static per-tensor input activations (`input_activations.dynamic: false`): an
    /// `input_scale` per linear layer.
    pub static_activations: bool,
    /// `ignore`: module names, or `re:` regexes, kept unquantized (as written, for reports).
    pub ignore: Vec<String>,
    /// The `re:` entries, compiled once (whole-name matches), for every linear layer's lookup.
    pub(super) ignore_patterns: Vec<fancy_regex::Regex>,
}

/// How compressed-tensors scales FP8 weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightStrategy {
    /// One scale per logical shard.
    Tensor,
    /// One scale per output row (`[out, 1]`).
    Channel,
    /// One scale per `[block_n, block_k]` block.
    Block([u64; 2]),
}

impl CompressedFp8 {
    pub(super) fn parse(qc: &Value) -> Result<CompressedFp8, QuantError> {
        Self::check_format(qc)?;
        let (gname, group) = Self::single_group(qc)?;
        let at = |k: &str| format!("config_groups.{gname}.{k}");
        let weights = Self::weights(group, &at)?;
        let static_activations = Self::activations(group)?;
        if matches!(weights, WeightStrategy::Block(_)) && static_activations {
            return Err(refuse(
                "compressed-tensors block FP8 weights need dynamic activations".into(),
                USE_UNQUANTIZED,
            ));
        }
        let ignore = match qc.get("ignore") {
            None | Some(Value::Null) => Vec::new(),
            Some(v) => string_list(v, "ignore")?,
        };
        let ignore_patterns = ignore
            .iter()
            .filter_map(|l| l.strip_prefix("re:"))
            .map(python_regex)
            .collect::<Result<_, _>>()?;
        Ok(CompressedFp8 {
            weights,
            static_activations,
            ignore,
            ignore_patterns,
        })
    }

    /// Whether `name` is left unquantized; `Err` when an `ignore` pattern cannot decide within
    /// [`IGNORE_BACKTRACK_LIMIT`] (then neither answer would be safe to write).
    pub(super) fn ignores(&self, name: &str) -> Result<bool, (String, &'static str)> {
        if self.ignore.iter().any(|l| l == name) {
            return Ok(true);
        }
        for r in &self.ignore_patterns {
            match r.is_match(name) {
                Ok(true) => return Ok(true),
                Ok(false) => {}
                Err(e) => {
                    let p = r.as_str();
                    let p = p.strip_prefix("^(?:").and_then(|p| p.strip_suffix(")$"));
                    return Err((
                        format!(
                            "quantization_config.ignore entry `re:{}` cannot be matched \
                             against {name} within {IGNORE_BACKTRACK_LIMIT} backtracking \
                             steps ({e})",
                            p.unwrap_or(r.as_str())
                        ),
                        "simplify the pattern (nested repetitions such as `(a+)+` \
                         backtrack exponentially)",
                    ));
                }
            }
        }
        Ok(false)
    }

    /// The parts of the config around the groups: float-quantized, no rotations, no quantized
    /// KV cache.
    fn check_format(qc: &Value) -> Result<(), QuantError> {
        let format = qc.get("format").and_then(Value::as_str).unwrap_or("");
        if format != "float-quantized" {
            return Err(refuse(
                format!(
                    "compressed-tensors format \"{format}\" is not supported: wload writes float-quantized (FP8) compressed-tensors checkpoints only"
                ),
                USE_UNQUANTIZED,
            ));
        }
        if qc.get("transform_config").is_some_and(|v| !v.is_null()) {
            return Err(refuse(
                "compressed-tensors with a transform_config (rotations) is not supported".into(),
                USE_UNQUANTIZED,
            ));
        }
        if qc.get("kv_cache_scheme").is_some_and(|v| !v.is_null()) {
            return Err(refuse(
                "compressed-tensors with a kv_cache_scheme (quantized KV cache scales) is not supported yet".into(),
                "remove kv_cache_scheme from quantization_config if the checkpoint has no kv scales",
            ));
        }
        Ok(())
    }

    /// The one config group, targeting `Linear`, with its name.
    fn single_group(qc: &Value) -> Result<(&String, &Value), QuantError> {
        let groups = qc
            .get("config_groups")
            .and_then(Value::as_object)
            .filter(|g| !g.is_empty())
            .ok_or_else(|| {
                refuse(
                    "compressed-tensors quantization_config has no config_groups".into(),
                    "the checkpoint's quantization_config is incomplete",
                )
            })?;
        if groups.len() > 1 {
            return Err(refuse(
                format!(
                    "compressed-tensors with {} config_groups (mixed schemes) is not supported; wload handles one FP8 group",
                    groups.len()
                ),
                USE_UNQUANTIZED,
            ));
        }
        let (gname, group) = groups.iter().next().expect("one group");
        let targets = group
            .get("targets")
            .map(|t| string_list(t, &format!("config_groups.{gname}.targets")))
            .transpose()?
            .unwrap_or_default();
        if targets != ["Linear"] {
            return Err(refuse(
                format!(
                    "compressed-tensors config_groups.{gname}.targets = {targets:?} is not supported; wload handles [\"Linear\"]"
                ),
                USE_UNQUANTIZED,
            ));
        }
        Ok((gname, group))
    }

    /// The group's weights: static, symmetric 8-bit floats, scaled per tensor, channel or block.
    fn weights(group: &Value, at: &dyn Fn(&str) -> String) -> Result<WeightStrategy, QuantError> {
        let w = group
            .get("weights")
            .filter(|w| !w.is_null())
            .ok_or_else(|| {
                refuse(
                    format!("compressed-tensors {} is missing", at("weights")),
                    USE_UNQUANTIZED,
                )
            })?;
        let (wtype, bits) = (field(w, "type"), field(w, "num_bits"));
        if wtype != "float" || bits != 8 {
            return Err(refuse(
                format!(
                    "compressed-tensors weights of type {wtype} with {bits} bits are not supported (INT4/INT8, NVFP4 and MXFP4 have their own packed layouts); wload writes 8-bit float weights"
                ),
                USE_UNQUANTIZED,
            ));
        }
        if field(w, "symmetric") == false || field(w, "dynamic") == true {
            return Err(refuse(
                "compressed-tensors FP8 weights must be static and symmetric (vLLM's W8A8Fp8 scheme)".into(),
                USE_UNQUANTIZED,
            ));
        }
        match field(w, "strategy").as_str() {
            Some("tensor") => Ok(WeightStrategy::Tensor),
            Some("channel") => Ok(WeightStrategy::Channel),
            Some("block") => Ok(WeightStrategy::Block(block_size(
                &field(w, "block_structure"),
                &at("weights.block_structure"),
            )?)),
            other => Err(refuse(
                format!(
                    "compressed-tensors FP8 weight strategy {other:?} is not supported (tensor, channel and block are)"
                ),
                USE_UNQUANTIZED,
            )),
        }
    }

    /// Whether the group's input activations are static (an `input_scale` per layer): 8-bit
    /// floats, dynamic per token or group, or static per tensor.
    fn activations(group: &Value) -> Result<bool, QuantError> {
        // Weight-only FP8 (W8A16) runs on Marlin with other parameters.
        let Some(a) = group.get("input_activations").filter(|a| !a.is_null()) else {
            return Err(refuse(
                "compressed-tensors FP8 without input_activations (weight-only W8A16) is not supported".into(),
                USE_UNQUANTIZED,
            ));
        };
        if field(a, "type") != "float" || field(a, "num_bits") != 8 {
            return Err(refuse(
                "compressed-tensors input activations other than 8-bit float are not supported"
                    .into(),
                USE_UNQUANTIZED,
            ));
        }
        match (field(a, "dynamic").as_bool(), field(a, "strategy").as_str()) {
            (Some(true), Some("token" | "group")) => Ok(false),
            (Some(false), Some("tensor")) => Ok(true),
            (d, s) => Err(refuse(
                format!(
                    "compressed-tensors FP8 input activations (dynamic {d:?}, strategy {s:?}) are not a scheme vLLM's W8A8Fp8 accepts"
                ),
                USE_UNQUANTIZED,
            )),
        }
    }
}

/// How many backtracking steps one match of an `ignore` pattern may take. Module names are short:
/// a real pattern (`.*self_attn.*`) takes hundreds; a pattern that backtracks exponentially is
/// refused when it hits this, in milliseconds, instead of running for hours.
pub const IGNORE_BACKTRACK_LIMIT: usize = 100_000;

/// A compressed-tensors `ignore` entry's `re:` pattern, compiled for whole-name matches. vLLM
/// matches these with Python's `re`, whose lookahead, lookbehind and backreferences the regex
/// crate lacks: fancy-regex has them, and hands the rest of a pattern to the regex crate.
fn python_regex(re: &str) -> Result<fancy_regex::Regex, QuantError> {
    fancy_regex::RegexBuilder::new(&format!("^(?:{re})$"))
        .backtrack_limit(IGNORE_BACKTRACK_LIMIT)
        .delegate_size_limit(crate::mapping::limits::REGEX_SIZE)
        .delegate_dfa_size_limit(crate::mapping::limits::REGEX_DFA_SIZE)
        .build()
        .map_err(|e| {
            refuse(
                format!(
                    "quantization_config.ignore entry `re:{re}` is not a valid Python regex \
                     (or one wload cannot run within its limits): {e}"
                ),
                "quantization_config is malformed: fix the pattern as Python's `re` reads it",
            )
        })
}

#[cfg(test)]
mod tests {
    use super::super::{QuantError, Quantization};
    use serde_json::{Value, json};

    fn q(v: Value) -> Result<Option<Quantization>, QuantError> {
        Quantization::from_config(Some(&v))
    }

    fn compressed(ignore: Value) -> Result<Option<Quantization>, QuantError> {
        q(json!({
            "quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ignore,
            "config_groups": {"group_0": {
                "targets": ["Linear"],
                "weights": {"type": "float", "num_bits": 8, "strategy": "tensor",
                            "symmetric": true, "dynamic": false},
                "input_activations": {"type": "float", "num_bits": 8, "strategy": "tensor",
                                      "symmetric": true, "dynamic": false}}}
        }))
    }

    /// vLLM matches `ignore` patterns with Python's `re`: lookaround and backreferences are
    /// valid there and must be here; a pattern Python refuses too is named as not a Python regex.
    #[test]
    fn ignore_patterns_are_python_regexes() {
        let got = compressed(json!([
            r"re:.*self_attn\.(?!q_proj).*",
            r"re:.*(?<=mlp\.)down_proj",
            r"re:model\.layers\.(\d)\.\1.*",
        ]))
        .expect("a valid config")
        .expect("quantized");
        let quantized = |m: &str| got.linear_quantized(m, &[]).expect("decided");
        assert!(quantized("model.layers.0.self_attn.q_proj"));
        assert!(!quantized("model.layers.0.self_attn.o_proj"));
        assert!(!quantized("model.layers.0.mlp.down_proj"));
        assert!(quantized("model.layers.0.mlp.up_proj"));
        assert!(!quantized("model.layers.3.3_x"));
        for bad in ["re:(?<x>a", "re:a)", "re:*"] {
            let e = compressed(json!([bad])).expect_err("refused").to_string();
            assert!(
                e.contains("not a valid Python regex") && e.contains(bad),
                "{e}"
            );
        }
    }

    /// A pattern that backtracks exponentially is stopped at the limit and reported, naming
    /// the pattern, never run for hours or taken as "no match".
    #[test]
    fn a_catastrophic_ignore_pattern_is_refused_not_run_forever() {
        let got = compressed(json!([r"re:(a|aa)+\1b"]))
            .expect("a valid regex")
            .expect("quantized");
        let t = std::time::Instant::now();
        let e = got
            .linear_quantized(&"a".repeat(64), &[])
            .expect_err("undecidable within the limit");
        assert!(t.elapsed().as_secs() < 5, "{:?}", t.elapsed());
        assert!(
            e.0.contains("backtracking steps") && e.0.contains("(a|aa)+"),
            "{e:?}"
        );
    }
}
