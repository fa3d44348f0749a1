//! Quantized checkpoints: what `quantization_config` says, in the terms vLLM 0.33 acts on
//! (`layers/quantization/fp8.py` `Fp8Config`, `compressed_tensors/compressed_tensors.py`), which
//! modules it leaves unquantized, and the checkpoint-name rules its config adds to every model's
//! mapper. The parameters each scheme creates are the planner's (`plan/quant.rs`).
//!
//! Supported: `quant_method: fp8` (per-tensor and block, AutoFP8 / DeepSeek / Qwen FP8 style) and
//! `compressed-tensors` with 8-bit float weights (per-tensor, per-channel, block). Everything else
//! is refused with its name before anything is planned: writing it as unquantized would be wrong.

use serde_json::Value;

use crate::mapping::rules::{RegexRule, Rules};

/// A quantization scheme wload writes the pre-processing state of.
#[derive(Debug, Clone)]
pub enum Quantization {
    /// `quant_method: fp8` (`Fp8Config`).
    Fp8(Fp8),
    /// `quant_method: compressed-tensors`, `format: float-quantized`, FP8 weights
    /// (`CompressedTensorsW8A8Fp8`).
    CompressedFp8(CompressedFp8),
}

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

#[derive(Debug, Clone)]
pub struct CompressedFp8 {
    pub weights: WeightStrategy,
    /// Static per-tensor input activations (`input_activations.dynamic: false`): an
    /// `input_scale` per linear layer.
    pub static_activations: bool,
    /// `ignore`: module names, or `re:` regexes, kept unquantized (as written, for reports).
    pub ignore: Vec<String>,
    /// The `re:` entries, compiled once (whole-name matches), for every linear layer's lookup.
    ignore_patterns: Vec<fancy_regex::Regex>,
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

/// Why a `quantization_config` is refused, and what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct QuantError {
    pub message: String,
    pub fix: String,
}

fn refuse(message: String, fix: &str) -> QuantError {
    QuantError {
        message,
        fix: fix.to_string(),
    }
}

const USE_UNQUANTIZED: &str = "use the unquantized (bf16) checkpoint, or an FP8 one (`quant_method: fp8` or compressed-tensors float-quantized)";

impl Quantization {
    /// The scheme `quantization_config` describes; `None` for an unquantized checkpoint.
    pub fn from_config(qc: Option<&Value>) -> Result<Option<Quantization>, QuantError> {
        let Some(qc) = qc else { return Ok(None) };
        match normalized_method(qc).as_str() {
            "fp8" => Fp8::parse(qc).map(|q| Some(Quantization::Fp8(q))),
            "compressed-tensors" => {
                CompressedFp8::parse(qc).map(|q| Some(Quantization::CompressedFp8(q)))
            }
            "" => Err(refuse(
                "config.json has a quantization_config without a quant_method".into(),
                "add quant_method to quantization_config, or remove it for an unquantized checkpoint",
            )),
            other => Err(refuse(
                format!(
                    "quantization_config.quant_method = \"{other}\" is not supported: wload writes unquantized, fp8 and compressed-tensors FP8 checkpoints; {other} weights have their own packed layouts, and writing them as anything else would be wrong"
                ),
                USE_UNQUANTIZED,
            )),
        }
    }

    /// `fp8` or `compressed-tensors`, as `quant_method` says.
    pub fn method(&self) -> &'static str {
        match self {
            Quantization::Fp8(_) => "fp8",
            Quantization::CompressedFp8(_) => "compressed-tensors",
        }
    }

    /// One line for reports: method, scheme, block, activations, ignored modules.
    pub fn describe(&self) -> String {
        let (scheme, act, ignored) = match self {
            Quantization::Fp8(q) => (
                match q.block {
                    Some([n, k]) => format!("FP8 block {n}×{k} (weight_scale_inv)"),
                    None => "FP8 per-tensor (weight_scale)".to_string(),
                },
                q.static_activations,
                q.ignored.len(),
            ),
            Quantization::CompressedFp8(q) => (
                match q.weights {
                    WeightStrategy::Tensor => "FP8 per-tensor weights".to_string(),
                    WeightStrategy::Channel => "FP8 per-channel weights".to_string(),
                    WeightStrategy::Block([n, k]) => format!("FP8 block {n}×{k} weights"),
                },
                q.static_activations,
                q.ignore.len(),
            ),
        };
        let act = if act {
            "static activation scales"
        } else {
            "dynamic activations"
        };
        format!(
            "{}: {scheme}, {act}, {ignored} module pattern(s) left unquantized",
            self.method()
        )
    }

    /// Whether the linear layer `module` (vLLM's name, e.g. `model.layers.0.self_attn.qkv_proj`)
    /// is quantized. `shards` are the checkpoint names of a fused layer's parts (`q_proj`, …):
    /// vLLM matches those, and all must agree (`is_layer_skipped`).
    /// `Err` holds the message and the fix.
    pub fn linear_quantized(
        &self,
        module: &str,
        shards: &[String],
    ) -> Result<bool, (String, &'static str)> {
        let ignored = |name: &str| self.ignores(name);
        if shards.is_empty() || ignored(module)? {
            return Ok(!ignored(module)?);
        }
        let proj = module.rsplit('.').next().unwrap_or(module);
        let skipped: Vec<bool> = shards
            .iter()
            .map(|s| ignored(&module.replace(proj, s)))
            .collect::<Result<_, _>>()?;
        if skipped.iter().any(|&s| s != skipped[0]) {
            return Err((
                format!(
                    "Detected some but not all shards of {module} are quantized. All shards of fused layers to have the same precision."
                ),
                "list every part of the fused layer in the quantization config's ignore list, or none",
            ));
        }
        Ok(!skipped[0])
    }

    /// Whether the experts module `module` (`model.layers.1.mlp.experts`) is quantized: vLLM
    /// skips it when an ignored name containing "experts" contains it.
    pub fn experts_quantized(&self, module: &str) -> bool {
        match self {
            Quantization::Fp8(q) => !q
                .ignored
                .iter()
                .any(|l| l.contains("experts") && l.contains(module)),
            // Compressed-tensors experts are refused before this is asked (plan/quant.rs).
            Quantization::CompressedFp8(_) => !self.ignores(module).unwrap_or(true),
        }
    }

    /// Whether `name` is left unquantized; `Err` when an `ignore` pattern cannot decide within
    /// [`IGNORE_BACKTRACK_LIMIT`] (then neither answer would be safe to write).
    fn ignores(&self, name: &str) -> Result<bool, (String, &'static str)> {
        match self {
            Quantization::Fp8(q) => Ok(q.ignored.iter().any(|l| l == name)),
            Quantization::CompressedFp8(q) => {
                if q.ignore.iter().any(|l| l == name) {
                    return Ok(true);
                }
                for r in &q.ignore_patterns {
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
        }
    }

    /// The rules vLLM's quant config adds to every model's weights mapper
    /// (`get_cache_scale_mapper`, `get_checkpoint_weight_mapper`, models/utils.py:465–468): kv
    /// cache scales renamed onto the Attention layer, `.g_idx` dropped; and the suffixes it lets
    /// go unmatched.
    pub fn name_rules(&self) -> (Rules, &'static [&'static str]) {
        let mut regex: Vec<(&str, Option<&str>)> = vec![
            (r"\.kv_scale$", Some(r".attn.k_scale")),
            (
                r"\.self_attn\.[kv]_proj\.([kv])_scale$",
                Some(r".self_attn.attn.\1_scale"),
            ),
            (
                r"\.self_attn\.qk(?:qk)?v_proj\.([kv])_scale$",
                Some(r".self_attn.attn.\1_scale"),
            ),
            (
                r"\.mixer\.[kv]_proj\.([kv])_scale$",
                Some(r".mixer.attn.\1_scale"),
            ),
            (r"\.self_attn\.q\.scale$", Some(r".self_attn.attn.q_scale")),
            (
                r"\.self_attn\.([kv])_cache\.scale$",
                Some(r".self_attn.attn.\1_scale"),
            ),
            // vLLM's `(?<!\.attn)\.([qkv])_scale$`: the regex crate has no look-behind, so the
            // text before the suffix is matched as "anything that does not end in `.attn`".
            (
                r"^((?:.*[^n]|.*[^t]n|.*[^t]tn|.*[^a]ttn|.*[^.]attn|n|tn|ttn|attn)?)\.([qkv])_scale$",
                Some(r"\1.attn.\2_scale"),
            ),
            (
                r"^((?:.*[^n]|.*[^t]n|.*[^t]tn|.*[^a]ttn|.*[^.]attn|n|tn|ttn|attn)?)\.([qkv])_zero_point$",
                Some(r"\1.attn.\2_zero_point"),
            ),
        ];
        if let Quantization::Fp8(_) = self {
            // Fp8Config's suffix renames, as regexes: wload applies suffix rules after the
            // stacked ones, vLLM's mapper before the model's own.
            regex.extend([
                (r"\.k_proj\.output_scale$", Some(r".attn.k_scale")),
                (r"\.v_proj\.output_scale$", Some(r".attn.v_scale")),
                (r"\.q_proj\.output_scale$", Some(r".attn.q_scale")),
                (
                    r"\.self_attn\.prob_output_scale$",
                    Some(r".self_attn.attn.prob_scale"),
                ),
            ]);
        }
        regex.push((r"\.g_idx$", None));
        let mut rules = Rules::default();
        rules.regex = regex
            .into_iter()
            .map(|(p, r)| RegexRule {
                pattern: p.to_string(),
                replace: r.map(str::to_string),
            })
            .collect();
        const IGNORED: &[&str] = &[
            ".q_scale",
            ".k_scale",
            ".v_scale",
            ".q_zero_point",
            ".k_zero_point",
            ".v_zero_point",
        ];
        (rules, IGNORED)
    }
}

impl Fp8 {
    fn parse(qc: &Value) -> Result<Fp8, QuantError> {
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
}

impl CompressedFp8 {
    fn parse(qc: &Value) -> Result<CompressedFp8, QuantError> {
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

/// `v[k]`, or `null`.
fn field(v: &Value, k: &str) -> Value {
    v.get(k).cloned().unwrap_or(Value::Null)
}

/// `quant_method` as vLLM normalises it (`_normalize_quantization_config`,
/// model_arch_config_convertor.py:241–283): ModelOpt configs named by their producer, lower
/// case, `compressed_tensors` spelled `compressed-tensors`.
fn normalized_method(qc: &Value) -> String {
    let modelopt = qc.pointer("/producer/name").and_then(Value::as_str) == Some("modelopt")
        || qc.pointer("/quantization/modelopt_quant_config").is_some();
    if modelopt {
        return "modelopt".into();
    }
    qc.get("quant_method")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_lowercase()
        .replace("compressed_tensors", "compressed-tensors")
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

fn block_size(v: &Value, key: &str) -> Result<[u64; 2], QuantError> {
    let dims: Option<Vec<u64>> = v
        .as_array()
        .map(|a| a.iter().map(Value::as_u64).collect::<Option<Vec<_>>>())
        .unwrap_or(None);
    match dims.as_deref() {
        Some(&[n, k]) if n > 0 && k > 0 => Ok([n, k]),
        Some(d) if d.len() != 2 => Err(refuse(
            format!(
                "The quantization block size of weight must have 2 dimensions, but got {} dimensions ({key})",
                d.len()
            ),
            "quantization_config is malformed",
        )),
        _ => Err(refuse(
            format!("quantization_config.{key} must be two positive integers, got {v}"),
            "quantization_config is malformed",
        )),
    }
}

fn string_list(v: &Value, key: &str) -> Result<Vec<String>, QuantError> {
    v.as_array()
        .and_then(|a| {
            a.iter()
                .map(|s| s.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
        })
        .ok_or_else(|| {
            refuse(
                format!("quantization_config.{key} must be a list of strings, got {v}"),
                "quantization_config is malformed",
            )
        })
}

/// What a checkpoint tensor is for, read from the last part of its name: the spellings vLLM's
/// quantization methods load (fp8, compressed-tensors, ModelOpt, GPTQ/AWQ), so that `inspect` can
/// describe a quantized checkpoint wload refuses as well as one it writes. A zero point goes with
/// the scale it offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TensorRole {
    Weight,
    WeightScale,
    InputScale,
    KvCacheScale,
    Bias,
    Other,
}

impl TensorRole {
    pub fn as_str(self) -> &'static str {
        match self {
            TensorRole::Weight => "weight",
            TensorRole::WeightScale => "weight scale",
            TensorRole::InputScale => "input scale",
            TensorRole::KvCacheScale => "kv-cache scale",
            TensorRole::Bias => "bias",
            TensorRole::Other => "other",
        }
    }
}

/// The role of the checkpoint tensor `name`.
pub fn tensor_role(name: &str) -> TensorRole {
    let (module, last) = name.rsplit_once('.').unwrap_or(("", name));
    match last {
        "weight" | "weight_packed" | "qweight" => TensorRole::Weight,
        "weight_scale"
        | "weight_scale_inv"
        | "weight_scale_2"
        | "weight_global_scale"
        | "weight_zero_point"
        | "scales"
        | "qzeros" => TensorRole::WeightScale,
        "input_scale" | "input_global_scale" | "input_zero_point" => TensorRole::InputScale,
        "k_scale" | "v_scale" | "q_scale" | "prob_scale" | "kv_scale" | "output_scale"
        | "prob_output_scale" | "k_zero_point" | "v_zero_point" | "q_zero_point" => {
            TensorRole::KvCacheScale
        }
        // `self_attn.q.scale`, `self_attn.k_cache.scale`: the older spellings `name_rules` renames.
        "scale"
            if [".q", ".k_cache", ".v_cache"]
                .iter()
                .any(|m| module.ends_with(m)) =>
        {
            TensorRole::KvCacheScale
        }
        "bias" => TensorRole::Bias,
        _ => TensorRole::Other,
    }
}

#[cfg(test)]
mod role_tests {
    use super::{TensorRole, tensor_role};

    #[test]
    fn tensor_roles_follow_the_name_suffix() {
        let l = "model.layers.0";
        for (name, role) in [
            (format!("{l}.self_attn.q_proj.weight"), TensorRole::Weight),
            (format!("{l}.input_layernorm.weight"), TensorRole::Weight),
            (
                format!("{l}.self_attn.q_proj.weight_scale"),
                TensorRole::WeightScale,
            ),
            (
                format!("{l}.mlp.experts.3.up_proj.weight_scale_inv"),
                TensorRole::WeightScale,
            ),
            (format!("{l}.mlp.down_proj.qzeros"), TensorRole::WeightScale),
            (
                format!("{l}.mlp.down_proj.input_scale"),
                TensorRole::InputScale,
            ),
            (
                format!("{l}.self_attn.k_proj.k_scale"),
                TensorRole::KvCacheScale,
            ),
            (format!("{l}.self_attn.kv_scale"), TensorRole::KvCacheScale),
            (
                format!("{l}.self_attn.v_proj.output_scale"),
                TensorRole::KvCacheScale,
            ),
            (
                format!("{l}.self_attn.q_zero_point"),
                TensorRole::KvCacheScale,
            ),
            (
                format!("{l}.self_attn.k_cache.scale"),
                TensorRole::KvCacheScale,
            ),
            (format!("{l}.self_attn.q_proj.bias"), TensorRole::Bias),
            (
                format!("{l}.mlp.gate.e_score_correction_bias"),
                TensorRole::Other,
            ),
            (format!("{l}.norm.scale"), TensorRole::Other),
            (format!("{l}.self_attn.q_proj.g_idx"), TensorRole::Other),
            ("weight".to_string(), TensorRole::Weight),
            (String::new(), TensorRole::Other),
        ] {
            assert_eq!(tensor_role(&name), role, "{name}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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

    #[test]
    fn a_fused_layer_with_some_shards_ignored_is_refused_as_vllm_does() {
        let got = q(
            json!({"quant_method": "fp8", "activation_scheme": "dynamic",
            "ignored_layers": ["model.layers.0.self_attn.q_proj"]}),
        )
        .unwrap()
        .unwrap();
        let shards = ["q_proj", "k_proj", "v_proj"].map(String::from);
        let err = got
            .linear_quantized("model.layers.0.self_attn.qkv_proj", &shards)
            .unwrap_err();
        assert!(err.0.contains("not all shards"), "{err:?}");
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

    #[test]
    fn unsupported_methods_and_schemes_are_named() {
        for (cfg, needle) in [
            (
                json!({"quant_method": "gptq", "bits": 4}),
                "\"gptq\" is not supported",
            ),
            (json!({"quant_method": "awq"}), "\"awq\" is not supported"),
            (
                json!({"quant_method": "mxfp4"}),
                "\"mxfp4\" is not supported",
            ),
            (json!({"quant_method": "fp8"}), "no activation_scheme"),
            (
                json!({"quant_method": "fp8", "activation_scheme": "static", "weight_block_size": [128, 128]}),
                "only supports dynamic activation scheme",
            ),
            (
                json!({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {}}),
                "\"pack-quantized\" is not supported",
            ),
            (
                json!({"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"g": {
                    "targets": ["Linear"], "weights": {"type": "float", "num_bits": 4, "strategy": "tensor_group"},
                    "input_activations": {"type": "float", "num_bits": 4, "dynamic": "local"}}}}),
                "with 4 bits are not supported",
            ),
        ] {
            let err = q(cfg).unwrap_err();
            assert!(err.message.contains(needle), "{}", err.message);
        }
    }

    /// Shipped mappings compile their regexes only when a name needs them, trusting that they
    /// compile: every one does, alone and with each scheme's rules merged in.
    #[test]
    fn every_shipped_mapping_compiles_with_every_schemes_rules() {
        let schemes = [
            Quantization::Fp8(Fp8 {
                block: Some([128, 128]),
                static_activations: false,
                ignored: vec![],
            }),
            Quantization::CompressedFp8(CompressedFp8 {
                weights: WeightStrategy::Channel,
                static_activations: false,
                ignore: vec![],
                ignore_patterns: vec![],
            }),
        ];
        for m in crate::mapping::embedded() {
            m.rules.check_regexes().unwrap();
            for q in &schemes {
                let with = m.with_quant_rules(Some(q));
                with.rules.check_regexes().unwrap();
                assert!(with.rules.regex.len() > m.rules.regex.len(), "{}", m.family);
            }
        }
    }

    #[test]
    fn kv_scale_names_move_onto_the_attention_layer_unless_already_there() {
        let (mut rules, _) = Quantization::Fp8(Fp8 {
            block: None,
            static_activations: false,
            ignored: vec![],
        })
        .name_rules();
        rules.compile().unwrap();
        let target = |n: &str| match rules.apply(n).expect("short names") {
            crate::mapping::rules::Outcome::Mapped(m) => m.target,
            crate::mapping::rules::Outcome::Dropped { .. } => "dropped".into(),
        };
        let l = "model.layers.3.self_attn";
        assert_eq!(
            target(&format!("{l}.k_proj.k_scale")),
            format!("{l}.attn.k_scale")
        );
        assert_eq!(target(&format!("{l}.q_scale")), format!("{l}.attn.q_scale"));
        assert_eq!(
            target(&format!("{l}.attn.v_scale")),
            format!("{l}.attn.v_scale")
        );
        assert_eq!(
            target(&format!("{l}.kv_scale")),
            format!("{l}.attn.k_scale")
        );
        assert_eq!(
            target(&format!("{l}.v_proj.output_scale")),
            format!("{l}.attn.v_scale")
        );
        assert_eq!(
            target(&format!("{l}.q_proj.weight_scale")),
            format!("{l}.q_proj.weight_scale")
        );
        assert_eq!(target(&format!("{l}.q_proj.g_idx")), "dropped");
    }
}
