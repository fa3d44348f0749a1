//! Quantized checkpoints: what `quantization_config` says, in the terms vLLM 0.33 acts on
//! (`layers/quantization/fp8.py` `Fp8Config`, `compressed_tensors/compressed_tensors.py`), which
//! modules it leaves unquantized, and the checkpoint-name rules its config adds to every model's
//! mapper. The parameters each scheme creates are the planner's (`plan/quant/`).
//!
//! Supported: `quant_method: fp8` (per-tensor and block, AutoFP8 / DeepSeek / Qwen FP8 style),
//! `compressed-tensors` (`compressed/`: 8-bit float weights per tensor, channel or block, packed
//! INT4/INT8 weight-only W4A16 / W8A16, INT8 W8A8, FP8 `kv_cache_scheme`s), ModelOpt NVFP4
//! (`modelopt.rs`), GPTQ (`gptq.rs`) and AWQ (`awq.rs`). Everything else is refused with its name before anything is
//! planned: writing it as unquantized would be wrong; methods vLLM 0.33 removed or deprecated
//! are refused in its words (`removed.rs`).
//!
//! One file per method: its config read as vLLM reads it, and its ignore list (`fp8.rs`,
//! `compressed/`, `modelopt.rs`, `gptq.rs`, `awq.rs`); the name rules every method adds to the
//! mapping, and what a tensor is for
//! (`names.rs`). This file dispatches on the method and holds the config helpers they share.

pub mod awq;
pub mod compressed;
pub mod fp8;
pub mod gptq;
pub mod modelopt;
pub mod mxfp4;
pub mod names;
mod removed;

use serde_json::Value;

use crate::dtype::Dtype;
use awq::Awq;
use compressed::Compressed;
use fp8::Fp8;
use gptq::Gptq;
use modelopt::ModelOptNvFp4;
use mxfp4::GptOssMxfp4;

/// A quantization scheme wload writes the pre-processing state of.
#[derive(Debug, Clone)]
pub enum Quantization {
    /// `quant_method: fp8` (`Fp8Config`).
    Fp8(Fp8),
    /// `quant_method: compressed-tensors`: FP8 (`CompressedTensorsW8A8Fp8`), packed integer
    /// weight-only (`CompressedTensorsWNA16`) or INT8 (`CompressedTensorsW8A8Int8`), with an
    /// optional `kv_cache_scheme`.
    Compressed(Compressed),
    /// ModelOpt NVFP4 (`ModelOptNvFp4Config`, `modelopt_fp4`): packed FP4 weights, F8_E4M3
    /// block scales and F32 global scales.
    ModelOptNvFp4(ModelOptNvFp4),
    /// `quant_method: gptq` / `gptq_marlin` / `marlin` (`AutoGPTQConfig`).
    Gptq(Gptq),
    /// `quant_method: awq` (`AutoAWQConfig`).
    Awq(Awq),
    /// `quant_method: mxfp4` on gpt-oss (`GptOssMxfp4Config`, `gpt_oss_mxfp4`): MXFP4 experts,
    /// everything else unquantized.
    GptOssMxfp4(GptOssMxfp4),
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

const USE_UNQUANTIZED: &str = "use the unquantized (bf16) checkpoint, or a release in a format wload writes (fp8; compressed-tensors FP8, W4A16/W8A16, W8A8 INT8; GPTQ; AWQ; gpt-oss MXFP4; ModelOpt NVFP4)";

impl Quantization {
    /// The scheme `quantization_config` describes, read without knowing the model (as vLLM
    /// with no `hf_config`: `mxfp4` is then nobody's gpt-oss). See [`Quantization::for_model`].
    pub fn from_config(qc: Option<&Value>) -> Result<Option<Quantization>, QuantError> {
        Quantization::for_model(qc, None)
    }

    /// The scheme `quantization_config` describes for a model of `model_type`; `None` for an
    /// unquantized checkpoint.
    pub fn for_model(
        qc: Option<&Value>,
        model_type: Option<&str>,
    ) -> Result<Option<Quantization>, QuantError> {
        let Some(qc) = qc else { return Ok(None) };
        match normalized_method(qc).as_str() {
            "fp8" => Fp8::parse(qc).map(|q| Some(Quantization::Fp8(q))),
            "mxfp4" | "gpt_oss_mxfp4" => {
                GptOssMxfp4::parse(qc, model_type).map(|q| Some(Quantization::GptOssMxfp4(q)))
            }
            "compressed-tensors" => {
                Compressed::parse(qc).map(|q| Some(Quantization::Compressed(q)))
            }
            "modelopt" | "modelopt_fp4" => {
                ModelOptNvFp4::parse(qc).map(|q| Some(Quantization::ModelOptNvFp4(q)))
            }
            "gptq" | "gptq_marlin" | "marlin" => {
                Gptq::parse(qc).map(|q| Some(Quantization::Gptq(q)))
            }
            "awq" => Awq::parse(qc).map(|q| Some(Quantization::Awq(q))),
            m @ ("bitsandbytes" | "fbgemm_fp8" | "fp_quant") => Err(removed::refusal(m)),
            "" => Err(refuse(
                "config.json has a quantization_config without a quant_method".into(),
                "add quant_method to quantization_config, or remove it for an unquantized checkpoint",
            )),
            other => Err(refuse(
                format!(
                    "quantization_config.quant_method = \"{other}\" is not supported: wload writes unquantized, fp8, compressed-tensors, GPTQ, AWQ, gpt-oss MXFP4 and ModelOpt NVFP4 checkpoints; {other} weights have their own packed layouts, and writing them as anything else would be wrong"
                ),
                USE_UNQUANTIZED,
            )),
        }
    }

    /// The method's name as vLLM's config names it (`fp8`, `compressed-tensors`, `modelopt_fp4`).
    pub fn method(&self) -> &'static str {
        match self {
            Quantization::Fp8(_) => "fp8",
            Quantization::Compressed(_) => "compressed-tensors",
            Quantization::ModelOptNvFp4(_) => "modelopt_fp4",
            Quantization::Gptq(_) => "gptq",
            Quantization::Awq(_) => "awq",
            Quantization::GptOssMxfp4(_) => "mxfp4",
        }
    }

    /// What vLLM's `maybe_update_config` reads from the checkpoint's headers: GPTQ's quantized
    /// modules and AWQ's unconverted ones, when the config does not list them.
    pub fn update_from_checkpoint<'a>(&mut self, tensors: impl Iterator<Item = (&'a str, Dtype)>) {
        match self {
            Quantization::Gptq(g) => g.update_from_checkpoint(tensors),
            Quantization::Awq(a) => a.update_from_checkpoint(tensors),
            Quantization::Fp8(_)
            | Quantization::Compressed(_)
            | Quantization::ModelOptNvFp4(_)
            | Quantization::GptOssMxfp4(_) => {}
        }
    }

    /// Whether vLLM's config class accepts the model dtype `dtype` (`get_supported_act_dtypes`);
    /// `Err` holds vLLM's refusal.
    pub fn supports(&self, dtype: Dtype) -> Result<(), String> {
        let torch = match dtype {
            Dtype::F32 => "torch.float32",
            Dtype::F16 => "torch.float16",
            _ => return Ok(()),
        };
        let (name, list) = match self {
            // GptOssMxfp4Config: bfloat16 only.
            Quantization::GptOssMxfp4(_) => ("gpt_oss_mxfp4", "[torch.bfloat16]"),
            _ if dtype != Dtype::F32 => return Ok(()),
            Quantization::Fp8(_) => ("fp8", "[torch.bfloat16, torch.float16]"),
            Quantization::Gptq(_) => ("auto_gptq", "[torch.float16, torch.bfloat16]"),
            Quantization::Awq(_) => ("auto_awq", "[torch.float16, torch.bfloat16]"),
            Quantization::ModelOptNvFp4(_) => (
                "modelopt_fp4",
                "[torch.bfloat16, torch.float16, torch.float8_e4m3fn]",
            ),
            Quantization::Compressed(_) => return Ok(()),
        };
        Err(format!(
            "{torch} is not supported for quantization method {name}. Supported dtypes: {list}"
        ))
    }

    /// One line for reports: method, scheme, block, activations, ignored modules.
    pub fn describe(&self) -> String {
        let (scheme, act, ignored) = match self {
            Quantization::Gptq(g) => return g.describe(),
            Quantization::Awq(a) => return a.describe(),
            Quantization::Fp8(q) => (
                match q.block {
                    Some([n, k]) => format!("FP8 block {n}×{k} (weight_scale_inv)"),
                    None => "FP8 per-tensor (weight_scale)".to_string(),
                },
                Some(q.static_activations),
                q.ignored.len(),
            ),
            Quantization::Compressed(q) => (q.describe_scheme(), q.static_input(), q.ignore.len()),
            Quantization::ModelOptNvFp4(q) => {
                return format!(
                    "{}: NVFP4 weights (packed E2M1, F8_E4M3 scale per {} elements, F32 global scale per part), {}, {} module pattern(s) excluded{}",
                    self.method(),
                    q.group_size,
                    if q.activations {
                        "NVFP4 activations (W4A4)"
                    } else {
                        "16-bit activations (W4A16)"
                    },
                    q.exclude.len(),
                    if q.exclude.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", q.exclude.join(", "))
                    }
                );
            }
            Quantization::GptOssMxfp4(q) => {
                return format!(
                    "mxfp4 (gpt_oss_mxfp4): MXFP4 experts (U8 E2M1 blocks, E8M0 scales per 32), every linear layer unquantized, {} module pattern(s) listed in modules_to_not_convert",
                    q.not_converted.len()
                );
            }
        };
        let act = match act {
            Some(true) => "static activation scales",
            Some(false) => "dynamic activations",
            None => "weight-only",
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
        match self {
            Quantization::Gptq(g) => return g.quantizes(module, shards),
            Quantization::Awq(a) => return a.skips(module, shards).map(|s| !s),
            // Mxfp4Config.get_quant_method: UnquantizedLinearMethod for every linear layer.
            Quantization::GptOssMxfp4(_) => return Ok(false),
            _ => {}
        }
        let exact = self.skipped_exactly(module, shards)?;
        Ok(match self {
            Quantization::ModelOptNvFp4(m) => !m.excludes(module, exact),
            _ => !exact,
        })
    }

    /// vLLM's `is_layer_skipped` with the method's own match: the module listed, or all of its
    /// fused parts (some but not all is an error, as in vLLM).
    fn skipped_exactly(
        &self,
        module: &str,
        shards: &[String],
    ) -> Result<bool, (String, &'static str)> {
        by_parts(
            module,
            shards,
            true,
            |name| self.ignores(name),
            "list every part of the fused layer in the quantization config's ignore list, or none",
        )
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
            Quantization::Compressed(_) => !self.ignores(module).unwrap_or(true),
            Quantization::ModelOptNvFp4(m) => !m.excludes(module, m.lists(module)),
            // AutoGPTQConfig quantizes every RoutedExperts (only `dynamic` rules, refused, skip).
            Quantization::Gptq(_) => true,
            Quantization::Awq(a) => !a.skips(module, &[]).unwrap_or(true),
            // Every RoutedExperts layer gets GptOssMxfp4MoEMethod.
            Quantization::GptOssMxfp4(_) => true,
        }
    }

    /// Whether `name` is left unquantized; `Err` when an `ignore` pattern cannot decide within
    /// [`compressed::IGNORE_BACKTRACK_LIMIT`] (then neither answer would be safe to write).
    fn ignores(&self, name: &str) -> Result<bool, (String, &'static str)> {
        match self {
            Quantization::Fp8(q) => Ok(q.ignores(name)),
            Quantization::Compressed(q) => q.ignores(name),
            Quantization::ModelOptNvFp4(q) => Ok(q.lists(name)),
            Quantization::Gptq(g) => g.quantizes(name, &[]).map(|q| !q),
            Quantization::Awq(a) => a.skips(name, &[]),
            Quantization::GptOssMxfp4(_) => Ok(true),
        }
    }
}

/// vLLM's rule for fused layers (`is_layer_skipped`, `is_layer_gptq_quantized`): a layer whose
/// checkpoint has parts (`qkv_proj` from `q_proj`, `k_proj`, `v_proj`) is decided by its parts'
/// names, which must all agree; `whole_first`: a match of the layer's own name decides first.
/// `matches` decides one name; `fix` says what to do when the parts disagree.
fn by_parts(
    module: &str,
    shards: &[String],
    whole_first: bool,
    matches: impl Fn(&str) -> Result<bool, (String, &'static str)>,
    fix: &'static str,
) -> Result<bool, (String, &'static str)> {
    if shards.is_empty() || (whole_first && matches(module)?) {
        return matches(module);
    }
    let proj = module.rsplit('.').next().unwrap_or(module);
    let each: Vec<bool> = shards
        .iter()
        .map(|s| matches(&module.replace(proj, s)))
        .collect::<Result<_, _>>()?;
    if each.iter().any(|&m| m != each[0]) {
        return Err((
            format!(
                "Detected some but not all shards of {module} are quantized. All shards of fused layers to have the same precision."
            ),
            fix,
        ));
    }
    Ok(each[0])
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn q(v: Value) -> Result<Option<Quantization>, QuantError> {
        Quantization::from_config(Some(&v))
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
    #[test]
    fn unsupported_methods_and_schemes_are_named() {
        for (cfg, needle) in [
            (json!({"quant_method": "hqq"}), "\"hqq\" is not supported"),
            (
                json!({"quant_method": "mxfp4"}),
                "wload writes MXFP4 only for gpt-oss",
            ),
            (json!({"quant_method": "fp8"}), "no activation_scheme"),
            (
                json!({"quant_method": "fp8", "activation_scheme": "static", "weight_block_size": [128, 128]}),
                "only supports dynamic activation scheme",
            ),
            (
                json!({"quant_method": "compressed-tensors", "format": "marlin-24", "config_groups": {"g": {"targets": ["Linear"], "weights": {"type": "int", "num_bits": 4}}}}),
                "\"marlin-24\" is not supported",
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
}
