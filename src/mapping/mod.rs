//! Declarative model mappings: one YAML file per model family (`mappings/*.yaml`, embedded in the
//! binary), saying how checkpoint names become vLLM parameters and what each parameter looks like.
//! The format is documented in docs/mapping-format.md.

mod compose;
pub(crate) mod expr;
pub(crate) mod limits;
pub(crate) mod rules;
mod transformers_backend;

use std::path::{Path, PathBuf};

use indexmap::IndexMap;
use serde::Deserialize;
use serde_json::Value;

pub(crate) use crate::layout::{ExpertPart, GptOssPart};
pub use expr::Expr;

/// The family files shipped in the binary, by file name: every `mappings/*.yaml` but
/// `common.yaml`, listed by build.rs, so that a new file needs no Rust edit.
pub const EMBEDDED: &[(&str, &str)] = include!(concat!(env!("OUT_DIR"), "/mappings.rs"));

/// Rules every family gets (vLLM's AutoWeightsLoader adds them to every mapper), and the named
/// parameter blocks family files `use`.
pub const COMMON: &str = include_str!("../../mappings/common.yaml");

/// A mapping resolved from its file, the files it extends and the blocks it uses: what the
/// planner reads.
#[derive(Debug, Clone)]
pub struct Mapping {
    /// Short name, e.g. `llama`. (What the file extends, its description and architectures
    /// are the file's: they choose and compose it, and are not inherited.)
    pub family: String,
    /// Config values used when config.json lacks them (the transformers config class defaults).
    pub defaults: IndexMap<String, Value>,
    /// Derived values, in order; each may use config fields and the entries before it. Values
    /// that depend on the layer index `i` are not here: they are written into the `layer`
    /// parameters' expressions that read them, and evaluated per layer there.
    pub derive: IndexMap<String, Expr>,
    /// Conditions vLLM enforces for a given `tp` (and `ep`), with the message and fix to print.
    pub checks: Vec<Check>,
    pub rules: rules::Rules,
    /// Checkpoint names with these suffixes are skipped silently when nothing maps them
    /// (vLLM's unexpected-suffix ignore list; `.bias` is always in it).
    pub ignore_unexpected_suffixes: Vec<String>,
    /// Checkpoint names containing one of these are dequantized at load when stored as FP8
    /// E4M3 with a `weight_scale…` sibling (vLLM's `_try_load_fp8_indexer_wk`,
    /// deepseek_v2.py:857–913): the weight fills its slot as `(w · scale)` in BF16.
    pub dequantize_fp8: Vec<String>,
    /// Checkpoint tensors of `model.layers.{i}.` for which this holds belong to no parameter and
    /// are skipped (vLLM skips speculative-decoding MTP layers beyond `num_hidden_layers`).
    pub skip_layer: Option<Expr>,
    /// Modules vLLM does not build (a `StageMissingLayer`: the vision tower under
    /// `--language-model-only`): checkpoint tensors mapped under `prefix` are skipped while
    /// `when` holds.
    pub skip_modules: Vec<SkipModule>,
    /// A layer every pipeline stage must hold, or vLLM refuses the model (Qwen3-MoE and GLM-4.5
    /// need a MoE layer on each stage).
    pub stage_needs: Option<StageNeed>,
    /// Why parameters the checkpoint does not fill are missing, when the config explains it
    /// (a GLM-5.2 config naming its IndexShare layers only in transformers' `indexer_types`).
    pub missing_hints: Vec<MissingHint>,
    /// The platform whose module tree the parameters follow, when vLLM builds the family
    /// differently per platform (`cuda`: DeepSeek-V3.2's models/deepseek_v32/nvidia tree, whose
    /// keys the CPU/XPU and ROCm trees do not share). Recorded in `wload.json` and shown by
    /// `inspect`; `None`: one tree everywhere.
    pub module_tree: Option<String>,
    /// Whether vLLM builds the encoder whole on every rank under `--mm-encoder-tp-mode data`
    /// (the model class's `supports_encoder_tp_data`); `false`: vLLM warns and falls back to
    /// `weights` (Gemma 3, Mistral 3: config/model.py:835–842). Inherited; `true` unless said.
    pub encoder_tp_data: bool,
    pub parameters: Parameters,
}

/// `skip_modules`: names mapped under `prefix` are no parameter and are skipped while `when`
/// holds, for `reason`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SkipModule {
    pub prefix: String,
    pub when: Expr,
    pub reason: String,
}

/// `stage_needs`: every pipeline stage (the whole model without PP) must hold a layer for which
/// `layer` holds; otherwise vLLM raises `message`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageNeed {
    pub layer: Expr,
    pub message: String,
    pub fix: Option<String>,
}

/// `missing_hints`: a parameter whose name contains `params`, that the checkpoint does not fill,
/// while `when` holds (per layer: `i` is the parameter's), is missing for the reason `message`
/// says, and `fix` is what to do instead of the generic "check the names".
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MissingHint {
    pub params: String,
    pub when: Expr,
    pub message: String,
    pub fix: String,
}

#[derive(Debug, Clone)]
pub struct Check {
    pub rule: Expr,
    pub message: String,
    pub fix: Option<String>,
    pub by: CheckBy,
}

/// Whose limit a mapping check is: what its refusal says (`vLLM requires …`, or that wload cannot
/// do it, which a flag may get around) and how `sizes` counts a layout it refuses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckBy {
    /// One of vLLM's asserts: vLLM refuses the layout.
    #[default]
    Vllm,
    /// What wload does not map (a vision tower): vLLM would load it, wload cannot.
    Wload,
}

/// vLLM's parameters in state_dict order: the ones before the decoder layers, those of layer `{i}`
/// (repeated `layers` times), and the ones after.
#[derive(Debug, Clone)]
pub struct Parameters {
    pub layers: Expr,
    pub head: Vec<ParamSpec>,
    pub layer: Vec<ParamSpec>,
    pub tail: Vec<ParamSpec>,
}

fn default_layers() -> Expr {
    Expr::parse("num_hidden_layers").expect("valid expression")
}

#[derive(Debug, Clone)]
pub struct ParamSpec {
    /// vLLM name; `{i}` is the layer index.
    pub name: String,
    /// Present only when this holds (e.g. `qkv_bias`, `i in mlp_only_layers`).
    pub when: Option<Expr>,
    pub layout: Layout,
    /// `model` (the resolved model dtype) or a safetensors dtype such as `F32`.
    pub dtype: String,
    /// Filled with `fill` and never read from the checkpoint (persistent buffers).
    pub buffer: bool,
    /// Value for buffers, and for `optional` parameters the checkpoint lacks.
    pub fill: Option<f64>,
    /// A checkpoint without this tensor is fine (it is filled with `fill`, default 0).
    pub optional: bool,
    /// This parameter is the same tensor as another when the condition holds (tied embeddings):
    /// vLLM keeps one key, the lexicographically smaller, at the first one's place.
    pub tied_to: Option<Tied>,
    /// Head and tail parameters: on which pipeline stages vLLM builds this module (the others hold
    /// a `PPMissingLayer`), as an expression of `first_stage` and `last_stage`. Models differ
    /// (Llama builds the embedding on the first stage only, Mixtral on every stage), so it is
    /// declared per family; layer parameters follow their layer.
    pub pp_stage: Option<Expr>,
    /// Which kind of vLLM module this parameter belongs to, for a quantized checkpoint; `None`:
    /// the default for its layout (see [`ParamSpec::quant_role`]).
    pub quant: Option<QuantRole>,
    /// Head and tail parameters of a repeated module (a vision tower's blocks): instantiated this
    /// many times, `{j}` in the name and `j` in expressions the index. Consecutive parameters
    /// whose names share the text before `{j}` repeat together, one module after another (vLLM's
    /// `ModuleList` order).
    pub repeat: Option<Expr>,
    /// When this holds, the parameter is whole on every rank whatever its layout: vLLM's
    /// `disable_tp=True` (a vision tower under `--mm-encoder-tp-mode data`).
    pub whole: Option<Expr>,
    /// A value vLLM's weight loader computes from the checkpoint tensor rather than copies
    /// (Mamba2's `A = -exp(A_log)`): an engine reduction.
    pub compute: Option<Compute>,
}

/// What a parameter's loader computes from its checkpoint tensor (`compute:`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Compute {
    /// `-torch.exp(x.float())` (Mamba2's `A` from `A_log`, mamba_mixer2.py:492–495), correctly
    /// rounded to F32: within 1 ulp of any device's `expf` (exec/reduce.rs).
    NegExp,
}

/// The kind of module a quantization method creates parameters for (vLLM's `get_quant_method`
/// dispatches on the layer class: `LinearBase`, `RoutedExperts`, `Attention`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QuantRole {
    /// A linear layer's `weight`: quantized, with scales beside it.
    Linear,
    /// A fused expert weight (`w13_weight`, `w2_weight`).
    Experts,
    /// The Attention layer, marked on its first scale buffer: the kv-cache scale parameters of the
    /// method go before it.
    Attention,
    /// Never quantized (embeddings, norms, routers built without a quant config).
    None,
}

impl ParamSpec {
    /// The stated role, else the default for the layout: a `.weight` of a parallel linear layout
    /// (column, row, merged_column, qkv) is a linear layer's, `experts` layouts are experts';
    /// everything else (replicated, vocab, biases) is not quantized. A replicated linear (a
    /// router built with the quant config) says `quant: linear`.
    pub(crate) fn quant_role(&self) -> QuantRole {
        if let Some(r) = self.quant {
            return r;
        }
        match self.layout {
            Layout::Experts(_) => QuantRole::Experts,
            Layout::Column(_)
            | Layout::Row(_)
            | Layout::MergedColumn(_)
            | Layout::Qkv(_)
            | Layout::MambaSplit(_)
                if self.name.ends_with(".weight") =>
            {
                QuantRole::Linear
            }
            _ => QuantRole::None,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tied {
    pub param: String,
    pub when: Expr,
}

/// How a parameter is split across tensor-parallel ranks, as the mapping writes it: the YAML
/// layout kinds with their dimensions as expressions (each kind's file in `layout/` says what
/// it means).
pub(crate) type Layout = crate::layout::Layout<Expr>;

impl ParamSpec {
    /// Every expression of the parameter (the layout's, `when`, `tied_to.when`, …) rewritten by
    /// `f`, in that order; the first error stops it.
    fn rewrite_exprs(
        &mut self,
        f: &mut dyn FnMut(&Expr) -> Result<Expr, String>,
    ) -> Result<(), String> {
        self.layout = self.layout.try_map(&mut |e, _| f(e))?;
        let others = (self.when.iter_mut())
            .chain(self.tied_to.as_mut().map(|t| &mut t.when))
            .chain(self.pp_stage.as_mut())
            .chain(self.repeat.as_mut())
            .chain(self.whole.as_mut());
        for e in others {
            *e = f(e)?;
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MappingError {
    #[error("{path}: cannot read: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{file}: invalid mapping: {message}")]
    Invalid { file: String, message: String },
    #[error(
        "no mapping for architecture '{arch}' (known: {known}); pass one with --mapping FILE (see docs/mapping-format.md)"
    )]
    UnknownArchitecture { arch: String, known: String },
    #[error(
        "{arch}: vLLM 0.33 builds it with its Transformers modeling backend ({class}, models/registry.py:747-782), whose state is transformers' module tree with vLLM's graph fusers applied (q/k/v into qkv_proj and gate/up into gate_up_proj where the traced forward allows, norms kept whole or split as they are detected, the rest split by the config's tensor-parallel plan); wload maps that layout only for Olmo3ForCausalLM, checked against real vLLM. Pass a mapping that states this model's fused layout with --mapping FILE (docs/mapping-format.md), checked with tools/vllm_reload.py"
    )]
    TransformersBackend { arch: String, class: &'static str },
    /// A name rule grew a checkpoint name past [`limits::MAX_NAME_GROWTH`].
    #[error("{0}")]
    NameTooLong(Box<limits::NameTooLong>),
    #[error(
        "config.json has no 'architectures'; add it, pass --hf-overrides '{{\"architectures\": [\"LlamaForCausalLM\"]}}', or choose a mapping with --mapping FILE"
    )]
    NoArchitecture,
}

impl MappingError {
    /// A `--mapping` file that cannot be read or is invalid is the command line's fault; a valid
    /// mapping that does not fit the checkpoint is the checkpoint's.
    pub fn exit_status(&self) -> crate::exit::ExitStatus {
        match self {
            // The shipped rules never grow a name much: only a `--mapping` file's can.
            MappingError::Io { .. }
            | MappingError::Invalid { .. }
            | MappingError::NameTooLong(_) => crate::exit::ExitStatus::Usage,
            _ => crate::exit::ExitStatus::Checkpoint,
        }
    }
}

/// Parses one mapping file's text: follows `extends`, expands the blocks it uses, applies its
/// edits, and merges the common rules into it. Its regexes are compiled at once, so that one the
/// regex engine refuses is reported here, with the file's name.
pub(crate) fn parse(file: &str, text: &str) -> Result<Mapping, MappingError> {
    let m = compose::resolve(file, text)?;
    m.rules
        .check_regexes()
        .map_err(|message| MappingError::Invalid {
            file: file.to_string(),
            message,
        })?;
    Ok(m)
}

/// A shipped mapping, parsed; its regexes are compiled when first needed (the tests compile
/// them all).
fn parse_embedded(file: &str, text: &str) -> Result<Mapping, MappingError> {
    compose::resolve(file, text)
}

/// Every embedded mapping, parsed.
#[cfg(test)]
pub(crate) fn embedded() -> Vec<Mapping> {
    EMBEDDED
        .iter()
        .map(|(f, t)| {
            parse_embedded(f, t).unwrap_or_else(|e| panic!("embedded mapping is invalid: {e}"))
        })
        .collect()
}

/// The mapping for a model: `--mapping FILE` if given, else the embedded one that lists the config's
/// first architecture.
pub fn select(file: Option<&Path>, arch: Option<&str>) -> Result<Mapping, MappingError> {
    if let Some(path) = file {
        let text = crate::small_file::read_to_string(path).map_err(|source| MappingError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        return parse(&path.display().to_string(), &text);
    }
    let arch = arch.ok_or(MappingError::NoArchitecture)?;
    // Only the chosen file is parsed in full: finding it needs just each file's architectures.
    if let Some((file, text)) = EMBEDDED
        .iter()
        .find(|(_, text)| declared_architectures(text).iter().any(|a| a == arch))
    {
        return parse_embedded(file, text);
    }
    if let Some(class) = transformers_backend::backend_class(arch) {
        return Err(MappingError::TransformersBackend {
            arch: arch.to_string(),
            class,
        });
    }
    let mut known: Vec<String> = EMBEDDED
        .iter()
        .flat_map(|(_, text)| declared_architectures(text))
        .collect();
    known.sort();
    known.dedup();
    Err(MappingError::UnknownArchitecture {
        arch: arch.to_string(),
        known: known.join(", "),
    })
}

/// The `architectures: [...]` line of a mapping file, read without parsing the rest.
fn declared_architectures(text: &str) -> Vec<String> {
    text.lines()
        .find_map(|l| l.strip_prefix("architectures:"))
        .and_then(|v| serde_saphyr::from_str::<Vec<String>>(v.trim()).ok())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    #[test]
    fn embedded_mappings_parse() {
        let all = super::embedded();
        assert_eq!(all.len(), super::EMBEDDED.len());
    }

    /// `select` finds files by their one-line `architectures:`; it must agree with the full parse,
    /// and no architecture may be claimed twice.
    #[test]
    fn architecture_lines_match_the_full_parse() {
        let mut seen = std::collections::HashSet::new();
        for (file, text) in super::EMBEDDED {
            #[derive(serde::Deserialize)]
            struct Head {
                #[serde(default)]
                architectures: Vec<String>,
            }
            let full: Head = serde_saphyr::from_str(text).unwrap_or_else(|e| panic!("{file}: {e}"));
            assert_eq!(
                super::declared_architectures(text),
                full.architectures,
                "{file}"
            );
            for a in &full.architectures {
                assert!(seen.insert(a.clone()), "{a} is claimed by two mappings");
            }
        }
    }
}
