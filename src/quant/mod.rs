//! Quantized checkpoints: what `quantization_config` says, in the terms vLLM 0.33 acts on, and
//! the parameters each method creates. A method is a [`Method`]: one file or folder here, and
//! one entry in [`METHODS`]. The planner, `inspect` and `shard` call it through the trait and
//! never name a method.
//!
//! Supported: `quant_method: fp8` (`fp8/`: per-tensor and block, AutoFP8 / DeepSeek / Qwen FP8
//! style), `compressed-tensors` (`compressed/`: 8-bit float weights per tensor, channel or block,
//! packed INT4/INT8 weight-only W4A16 / W8A16, INT8 W8A8, NVFP4, FP8 `kv_cache_scheme`s),
//! ModelOpt NVFP4 (`modelopt.rs`), GPTQ (`gptq/`), AWQ (`awq.rs`) and gpt-oss MXFP4
//! (`mxfp4.rs`). Everything else is refused with its name before anything is planned: writing
//! it as unquantized would be wrong; methods vLLM 0.33 removed or deprecated are refused in its
//! words (`removed.rs`).
//!
//! What the methods share: the small context they plan in (`cx.rs`), the parameters they add
//! (`extra.rs`), a linear weight's geometry read for packed parameters (`linear.rs`), NVFP4's
//! parameters under its two spellings (`nvfp4.rs`), what `inspect` says (`info.rs`), and the
//! name rules every method adds to the mapping (`names.rs`). This file holds the trait, the
//! table and the config helpers.

pub(crate) mod awq;
pub(crate) mod compressed;
pub(crate) mod cx;
pub(crate) mod extra;
pub(crate) mod fp8;
pub(crate) mod gptq;
pub(crate) mod info;
mod linear;
pub(crate) mod modelopt;
mod moe_backend;
pub(crate) mod mxfp4;
pub(crate) mod names;
mod nvfp4;
mod removed;

use std::fmt::Debug;
use std::sync::LazyLock;

use serde_json::Value;

use crate::dtype::Dtype;
use crate::mapping::rules::Rules;
use cx::{Cx, Weight};
use extra::Extra;
use info::QuantInfo;

/// `--moe-backend`: the MoE backend whose padding gpt-oss MXFP4 experts get, and whose choice
/// sizes NVFP4 experts' input scales under expert parallelism.
pub use moe_backend::MoeBackend;

/// One quantization method as vLLM 0.33 runs it: what its config says, which layers it
/// quantizes, the parameters it registers (in vLLM's order, with vLLM's initial values), what
/// `inspect` says of it and what an output's config must say for vLLM to reload it. Parsing is
/// the method's own function, named in [`METHODS`].
pub trait Method: CloneMethod + Debug + Send + Sync {
    /// The method's name as vLLM's config names it (`fp8`, `compressed-tensors`, `modelopt_fp4`).
    fn name(&self) -> &'static str;

    /// One line for reports: method, scheme, block, activations, ignored modules.
    fn describe(&self) -> String;

    /// Whether vLLM's config class accepts the model dtype `dtype` (`get_supported_act_dtypes`);
    /// `Err` holds vLLM's refusal.
    fn supports(&self, dtype: Dtype) -> Result<(), String>;

    /// What vLLM's `maybe_update_config` reads from the checkpoint's headers (GPTQ's quantized
    /// modules, AWQ's unconverted ones), when the config does not list them. `Err`: what vLLM
    /// then fails on (AWQ's derived list naming a quantized module's parent).
    fn update_from_checkpoint(
        &mut self,
        _tensors: &mut dyn Iterator<Item = (&str, Dtype)>,
    ) -> Result<(), QuantError> {
        Ok(())
    }

    /// The method's ignore list through the model's renames (`Fp8Config.apply_vllm_mapper`).
    fn apply_vllm_mapper(&mut self, _rules: &Rules) {}

    /// Checkpoint-name rules this method adds to the ones every method adds (`names.rs`):
    /// regex and replacement (`None`: dropped).
    fn name_rules(&self) -> Vec<(&'static str, Option<&'static str>)> {
        Vec::new()
    }

    /// Whether the linear layer `module` (vLLM's name, e.g. `model.layers.0.self_attn.qkv_proj`)
    /// is quantized. `shards` are the checkpoint names of a fused layer's parts (`q_proj`, …):
    /// vLLM matches those, and all must agree (`is_layer_skipped`). `Err` holds the message and
    /// the fix.
    fn linear_quantized(
        &self,
        module: &str,
        shards: &[String],
    ) -> Result<bool, (String, &'static str)>;

    /// Whether the method plans a merged column filled by tuple shards (Qwen3.5's GDN
    /// `in_proj_qkvz`): its scales must be cut per tuple (`layout/block_scale.rs`).
    fn plans_tuple_columns(&self) -> bool {
        false
    }

    /// Whether vLLM's config is an `AutoAWQConfig`, `AutoGPTQConfig` or `INCConfig`: the
    /// configs for which, on CUDA, a model replicates a layer too narrow for Marlin even when
    /// that layer is left unquantized (Qwen3.5's GDN `in_proj_ba`, `maybe_disable_tp`,
    /// `qwen_gdn_linear_attn.py:853–869`). Mappings read it as `quant_marlin_int`.
    fn marlin_int_config(&self) -> bool {
        false
    }

    /// Whether its experts are laid out for `--moe-backend b` (gpt-oss MXFP4's padding, NVFP4's
    /// input scales under expert parallelism): `Err` holds the refusal and the fix when this
    /// method's experts do not depend on a backend, or vLLM takes no such backend for them.
    fn moe_backend(&self, b: MoeBackend) -> Result<(), (String, String)> {
        Err(moe_backend_unused(b))
    }

    /// A quantized linear layer's weight `w` (named `<module>.weight`): its dtype, name and
    /// geometry as the method registers it, and the parameters that follow it. `None`: the
    /// layer stays as it is (a refusal is then in `cx.problems`).
    fn linear(&self, w: Weight<'_>, cx: &mut Cx<'_>) -> Option<Vec<Extra>>;

    /// A fused expert weight (`…routed_experts.w13_weight`, `w2_weight`): as [`Method::linear`],
    /// for the experts layer, when the method quantizes it.
    fn experts(&self, w: Weight<'_>, cx: &mut Cx<'_>) -> Option<Vec<Extra>>;

    /// The kv-cache parameters of the Attention layer `attention` (`….self_attn.attn`), before
    /// its scale buffers; `None`: it keeps only those.
    fn kv_cache(&self, attention: &str, cx: &mut Cx<'_>) -> Option<Vec<Extra>>;

    /// What `inspect` says of the method.
    fn inspect(&self) -> QuantInfo;

    /// What the output's config.json must say for vLLM to reload the rank files:
    /// `quantization_config` (`qc`) edited, and the change in words. `written` lists what the
    /// plan writes (found only when asked).
    fn output_config(
        &self,
        _qc: &mut Value,
        _written: &dyn Fn() -> Vec<Written>,
    ) -> Option<String> {
        None
    }
}

/// One tensor the plan writes on the first rank of each stage, and the checkpoint tensors it is
/// filled from, for [`Method::output_config`].
#[derive(Debug, Clone)]
pub struct Written {
    pub name: String,
    pub sources: Vec<String>,
}

/// `Clone` for boxed methods (a method's state changes per plan: [`Method::update_from_checkpoint`]).
pub trait CloneMethod {
    fn clone_method(&self) -> Box<dyn Method>;
}

impl<T: Method + Clone + 'static> CloneMethod for T {
    fn clone_method(&self) -> Box<dyn Method> {
        Box::new(self.clone())
    }
}

/// A parsed `quantization_config`: the method it names.
#[derive(Debug)]
pub struct Quantization(Box<dyn Method>);

impl Clone for Quantization {
    fn clone(&self) -> Quantization {
        Quantization(self.0.clone_method())
    }
}

impl std::ops::Deref for Quantization {
    type Target = dyn Method;
    fn deref(&self) -> &(dyn Method + 'static) {
        &*self.0
    }
}

impl std::ops::DerefMut for Quantization {
    fn deref_mut(&mut self) -> &mut (dyn Method + 'static) {
        &mut *self.0
    }
}

/// A method's parser: the config, and the model's `model_type`.
type Parse = fn(&Value, Option<&str>) -> Result<Box<dyn Method>, QuantError>;

/// One method wload writes: the `quant_method` names vLLM normalises to it, its parser, and how
/// refusals name it (in the list of what wload writes, and of the releases to use instead).
struct Entry {
    names: &'static [&'static str],
    parse: Parse,
    label: &'static str,
    formats: &'static str,
}

fn boxed<M: Method + 'static>(m: Result<M, QuantError>) -> Result<Box<dyn Method>, QuantError> {
    m.map(|m| Box::new(m) as Box<dyn Method>)
}

/// Every method wload writes, in the order refusals list them. Adding a method is its file and
/// one entry here.
const METHODS: &[Entry] = &[
    Entry {
        names: &["fp8"],
        parse: |qc, _| boxed(fp8::Fp8::parse(qc)),
        label: "fp8",
        formats: "fp8",
    },
    Entry {
        names: &["compressed-tensors"],
        parse: |qc, _| boxed(compressed::Compressed::parse(qc)),
        label: "compressed-tensors",
        formats: "compressed-tensors FP8, W4A16/W8A16, W8A8 INT8",
    },
    Entry {
        names: &["gptq", "gptq_marlin", "marlin"],
        parse: |qc, _| boxed(gptq::Gptq::parse(qc)),
        label: "GPTQ",
        formats: "GPTQ",
    },
    Entry {
        names: &["awq"],
        parse: |qc, _| boxed(awq::Awq::parse(qc)),
        label: "AWQ",
        formats: "AWQ",
    },
    Entry {
        names: &["mxfp4", "gpt_oss_mxfp4"],
        parse: |qc, t| boxed(mxfp4::GptOssMxfp4::parse(qc, t)),
        label: "gpt-oss MXFP4",
        formats: "gpt-oss MXFP4",
    },
    Entry {
        names: &["modelopt", "modelopt_fp4"],
        parse: |qc, _| boxed(modelopt::ModelOptNvFp4::parse(qc)),
        label: "ModelOpt NVFP4",
        formats: "ModelOpt NVFP4",
    },
];

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

/// The fix of a refused scheme: the releases wload writes, from [`METHODS`].
static USE_UNQUANTIZED: LazyLock<String> = LazyLock::new(|| {
    let formats: Vec<&str> = METHODS.iter().map(|e| e.formats).collect();
    format!(
        "use the unquantized (bf16) checkpoint, or a release in a format wload writes ({})",
        formats.join("; ")
    )
});

/// "unquantized, fp8, …, GPTQ and ModelOpt NVFP4": what wload writes, from [`METHODS`].
fn writes() -> String {
    let labels: Vec<&str> = METHODS.iter().map(|e| e.label).collect();
    let (last, rest) = labels.split_last().expect("methods");
    format!("unquantized, {} and {last}", rest.join(", "))
}

/// The refusal of `--moe-backend b` for a checkpoint whose experts (if any) are the same on
/// every backend: the message and the fix.
pub(crate) fn moe_backend_unused(b: MoeBackend) -> (String, String) {
    (
        format!(
            "--moe-backend {}: wload lays out experts for a MoE backend only for MXFP4 (gpt_oss_mxfp4) and NVFP4 experts, and this checkpoint has neither",
            b.as_str()
        ),
        "leave out --moe-backend (pass it to vllm serve if you want it)".into(),
    )
}

impl Quantization {
    #[cfg(test)]
    /// The scheme `quantization_config` describes, read without knowing the model (as vLLM
    /// with no `hf_config`: `mxfp4` is then nobody's gpt-oss). See [`Quantization::for_model`].
    pub(crate) fn from_config(qc: Option<&Value>) -> Result<Option<Quantization>, QuantError> {
        Quantization::for_model(qc, None)
    }

    /// The scheme `quantization_config` describes for a model of `model_type`; `None` for an
    /// unquantized checkpoint.
    pub(crate) fn for_model(
        qc: Option<&Value>,
        model_type: Option<&str>,
    ) -> Result<Option<Quantization>, QuantError> {
        let Some(qc) = qc else { return Ok(None) };
        let method = normalized_method(qc);
        if let Some(e) = METHODS.iter().find(|e| e.names.contains(&method.as_str())) {
            return (e.parse)(qc, model_type).map(|m| Some(Quantization(m)));
        }
        match method.as_str() {
            m @ ("bitsandbytes" | "fbgemm_fp8" | "fp_quant") => Err(removed::refusal(m)),
            "" => Err(refuse(
                "config.json has a quantization_config without a quant_method".into(),
                "add quant_method to quantization_config, or remove it for an unquantized checkpoint",
            )),
            other => Err(refuse(
                format!(
                    "quantization_config.quant_method = \"{other}\" is not supported: wload writes {} checkpoints; {other} weights have their own packed layouts, and writing them as anything else would be wrong",
                    writes()
                ),
                &USE_UNQUANTIZED,
            )),
        }
    }
}

/// vLLM's refusal of the model dtype `dtype` for a method that runs in `list` only
/// (`get_supported_act_dtypes`): F32 for every method that lists no F32, and F16 too for
/// `bf16_only` ones.
fn refuse_dtype(dtype: Dtype, name: &str, list: &str, bf16_only: bool) -> Result<(), String> {
    let torch = match dtype {
        Dtype::F32 => "torch.float32",
        Dtype::F16 if bf16_only => "torch.float16",
        _ => return Ok(()),
    };
    Err(format!(
        "{torch} is not supported for quantization method {name}. Supported dtypes: {list}"
    ))
}

/// One line for reports: `method: scheme, activations, N module pattern(s) left unquantized`;
/// `static_input` `None` for a weight-only scheme.
fn describe_line(name: &str, scheme: &str, static_input: Option<bool>, ignored: usize) -> String {
    let act = match static_input {
        Some(true) => "static activation scales",
        Some(false) => "dynamic activations",
        None => "weight-only",
    };
    format!("{name}: {scheme}, {act}, {ignored} module pattern(s) left unquantized")
}

/// vLLM's `is_layer_skipped` with a method's own match `ignores`: the module listed, or all of
/// its fused parts (some but not all is an error, as in vLLM).
fn skipped_exactly(
    module: &str,
    shards: &[String],
    ignores: impl Fn(&str) -> Result<bool, (String, &'static str)>,
) -> Result<bool, (String, &'static str)> {
    by_parts(
        module,
        shards,
        true,
        ignores,
        "list every part of the fused layer in the quantization config's ignore list, or none",
    )
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
